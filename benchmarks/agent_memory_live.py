"""Agent memory, live: does a session's KV survive its tool calls on the running stack?
Prints JSON.

The live counterpart of ``agent_memory.py``'s resume section. Each run is a fresh ``tideserve
up`` (embedded Postgres and Redis, the four services, ``--engines`` simulated engines of
``--kv-blocks`` 64-token blocks running ``--speedup`` times faster) with a Mooncake Transfer
Engine KV-cache tier where the variant has one (a ``tideserve engine --role kvcache``
process holding ``--tier-mib`` of DRAM). ``tideserve bench --sessions first-block`` replays
a slice of the WEKA agentic trace with its think and tool gaps restored (arrivals x
``--gap-scale``), each request naming its session, in trace time (``--speedup``). The
engines' modelled time runs ``--speedup`` times faster but the tier's transfers take real
time, and an engine waits for the longer of the real and the modelled fetch: so the data
plane moves 1/``--speedup`` of the bytes it would at speed 1 (``--kv-bytes-scale``: with
the engines' default a real fetch's wall time counts ``--speedup`` times in trace time).
Variants:

- ``lru``: today's engines (LRU, no tier), kvmeta's retention off;
- ``retention``: kvmeta's retention controller enforcing (``retention: enforce``, prefetch
  off), the engines offloading what they evict to the tier;
- ``retention_prefetch``: the same with prefetch before the predicted return;
- ``sglang_cache_aware``: sglang-router (``cache_aware``) in front of the ``lru`` engines
  instead of the gateway (the peer: no sessions, engines' LRU);
- ``warm`` (the reference): ``lru`` with 64x the KV to cache in but the same KV for running
  requests (``tideserve engine --kv-running-blocks``), so only what stays cached differs.

Per variant and slice, over the resumed turns (a session's second turn on):
``resume.reuse_ratio`` (of the tokens a turn shares with its session's previous turn, the
share its engine reported cached: on the GPU or fetched from the tier, at admission, which
is stricter than the simulator's "when it arrived"), ``resume.ttft_p95_vs_warm`` (p95 TTFT
over the same turns' p95 in ``warm``), ``resume.ttft_p95_ms``, ``fleet_kv_used`` (mean of
the engines' used blocks over their capacity, sampled every second while requests are in
flight), ``protected_kv_share`` (the same for the blocks retention protects), ``failed``.
kvmeta's retention counters are kept per run.

    .venv/bin/python benchmarks/agent_memory_live.py --slices 0:20,20:40,40:59 --speedup 8 \\
        --out /tmp/am_live.json

A slice of 300 requests spans about 800-1,050 s of restored trace time, so a run takes
about that over ``--speedup`` plus a minute to start and stop the stack.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from _agentic_slice import p95, parse_slice, slice_trace  # noqa: E402
from _compare_fleet import wait_router  # noqa: E402
from _harness import (  # noqa: E402
    TRACES,
    ProcGroup,
    command_line,
    emit_json,
    free_port,
    http_get,
    machine,
    run_child,
    sglang_router_python,
    tideserve,
    wait_http,
)

from services.common.bench.traces import TraceRequest, load_trace  # noqa: E402

TRACE = TRACES / "weka_agentic_dev.jsonl"
VARIANTS = ("lru", "retention", "retention_prefetch", "sglang_cache_aware")
TIER_VARIANTS = ("retention", "retention_prefetch")  # kvmeta enforcing, engines with the tier
BLOCK = 512  # the trace's tokens per hash id
MEAN_KEYS = (
    "resume.reuse_ratio", "resume.ttft_p95_vs_warm", "fleet_kv_used", "protected_kv_share",
    "failed",
)  # fmt: skip


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--trace", default=str(TRACE))
    p.add_argument("--slices", default="0:20,20:40,40:59", help="comma list of A:B ranges")
    p.add_argument("--max-requests", type=int, default=300)
    p.add_argument("--gap-scale", type=float, default=10.0, help="restore the trace's gaps")
    p.add_argument("--speedup", type=float, default=8.0, help="engines and replay, x faster")
    p.add_argument("--engines", type=int, default=2)
    p.add_argument("--kv-blocks", type=int, default=2300)
    p.add_argument("--warm-factor", type=int, default=64)
    p.add_argument("--tier-mib", type=int, default=2048)
    p.add_argument(
        "--kv-bytes-scale", type=int, default=None,
        help="the engines' --kv-bytes-scale (default 256 x --speedup: the bytes the data "
        "plane moves shrink with the engines' speedup, so a tier fetch's real time scales "
        "as the modelled time does)",
    )  # fmt: skip
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--base-port-offset", type=int, default=1500)
    p.add_argument("--work-dir", default=None, help="logs and state (default a temp dir)")
    p.add_argument("--out", default=None)
    return p.parse_args(argv)


def write_trace(reqs: list[TraceRequest], gap_scale: float, path: Path) -> None:
    t0 = reqs[0].arrival_s
    with path.open("w") as f:
        for r in reqs:
            ms = round((r.arrival_s - t0) * gap_scale * 1000.0, 3)
            f.write(json.dumps({"timestamp": ms, "input_length": r.input_length,
                                "output_length": r.output_length,
                                "hash_ids": list(r.hash_ids or [])}) + "\n")  # fmt: skip


def resumed_turns(reqs: list[TraceRequest]) -> dict[int, int]:
    """Request index (in arrival order) -> tokens it shares with its session's previous
    turn (whole 512-token blocks, at most either prompt), for every session's second turn on."""
    last: dict[int, TraceRequest] = {}
    out: dict[int, int] = {}
    for i, r in enumerate(reqs):
        ids = list(r.hash_ids or [])
        if not ids:
            continue
        prev = last.get(ids[0])
        if prev is not None:
            pids = list(prev.hash_ids or [])
            common = 0
            while common < min(len(ids), len(pids)) and ids[common] == pids[common]:
                common += 1
            out[i] = min(common * BLOCK, r.input_length, prev.input_length)
        last[ids[0]] = r
    return out


def config_yaml(args: argparse.Namespace, variant: str) -> str:
    off = args.base_port_offset
    tier = variant in TIER_VARIANTS
    engine_args: list[str] = []
    kv_blocks = args.kv_blocks
    if variant == "warm":
        kv_blocks = args.kv_blocks * args.warm_factor
        engine_args += ["--kv-running-blocks", str(args.kv_blocks)]
    if tier:
        scale = args.kv_bytes_scale or round(256 * args.speedup)
        engine_args += [
            "--kv-bytes-scale", str(scale),
            "--kvcache-tier", "--kvcache-policy", "offload_on_evict",
            "--kvmeta-address", f"127.0.0.1:{50052 + off}",
            "--te-metadata-url", f"http://127.0.0.1:{8081 + off}/metadata",
        ]  # fmt: skip
    cfg = {
        "stack": {
            "engines": args.engines, "engine_kv_blocks": kv_blocks,
            "engine_speedup": args.speedup, "gateways": 1, "engine_args": engine_args,
        },
        "kvmeta": {
            "retention": "enforce" if tier else "off",
            "retention_prefetch": variant == "retention_prefetch",
            "retention_tick_s": max(0.2, 1.0 / args.speedup),
            "metadata_http_open": True,
        },
        "scheduler": {"agent_sessions": True},
    }  # fmt: skip
    return json.dumps(cfg)  # JSON is YAML


class KVSampler:
    """Every second, each engine's used and protected blocks over its capacity."""

    def __init__(self, urls: list[str]) -> None:
        self.urls = urls
        self.used: list[float] = []
        self.protected: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> KVSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            cap = used = prot = 0
            for u in self.urls:
                status, body = http_get(u + "/tideserve/retention", 2.0)
                if status != 200:
                    continue
                d = json.loads(body)
                cap += d["capacity_blocks"]
                used += d["used_blocks"]
                prot += d.get("protected_blocks", 0)
            if cap:
                self.used.append(used / cap)
                self.protected.append(prot / cap)


def kvmeta_counters(url: str) -> dict[str, float]:
    """kvmeta's retention and prefetch counters: ``retention.<event>``,
    ``prefetch.<outcome>``."""
    status, body = http_get(url, 5.0)
    out: dict[str, float] = {}
    for line in body.decode(errors="replace").splitlines() if status == 200 else []:
        for metric, kind in (
            ("tideserve_kvmeta_retention_events_total{", "retention"),
            ("tideserve_kvmeta_prefetch", "prefetch"),
        ):
            if line.startswith(metric) and "{" in line and "_created" not in line:
                labels, _, value = line.partition("{")[2].rpartition("} ")
                out[f"{kind}.{labels.partition('=')[2].strip(chr(34))}"] = float(value)
    return out


def start_sglang(group: ProcGroup, engines: list[str]) -> str:
    """sglang-router ``cache_aware`` in front of ``engines``, once every worker is healthy."""
    py, why = sglang_router_python()
    if py is None:
        raise RuntimeError(f"sglang-router unavailable: {why}")
    port = free_port()
    group.start("sglang-router", [
        str(py), "-m", "sglang_router.launch_router", "--host", "127.0.0.1",
        "--port", str(port), "--log-level", "warn", "--prometheus-host", "127.0.0.1",
        "--prometheus-port", str(free_port()), "--worker-urls", *engines,
        "--policy", "cache_aware",
    ])  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    wait_router("sglang:cache_aware", url, len(engines), group)
    return url


START_ATTEMPTS = 3


def start_stack(group: ProcGroup, run_dir: Path, cfg: Path, off: int, ready: list[str]) -> None:
    """``tideserve up`` in ``run_dir``, once every URL of ``ready`` answers. The services'
    ports (50051 and up, plus the offset) lie in Linux's ephemeral range, so another
    process's outgoing connection can hold one for a moment: a start that fails on a port
    in use is tried again (at most :data:`START_ATTEMPTS` times) on a fresh state dir."""
    for attempt in range(1, START_ATTEMPTS + 1):
        tag = "" if attempt == 1 else f"-{attempt}"
        state = run_dir / f"state{tag}"
        up = group.start(f"up{tag}", tideserve(
            "up", "--insecure", "--state-dir", str(state),
            "--base-port-offset", str(off), "--config", str(cfg),
        ))  # fmt: skip
        try:
            for url in ready:
                wait_http(url, group, 180.0)
            return
        except RuntimeError:
            if attempt == START_ATTEMPTS or "already in use" not in up.tail(20000):
                raise
            print(f"tideserve up: a port was in use, starting again ({attempt})", file=sys.stderr)
            group.stop(timeout_s=30.0)
            time.sleep(5.0)


def run_variant(
    args: argparse.Namespace, variant: str, trace_file: Path, work: Path
) -> dict[str, Any]:
    """One fresh stack, the slice replayed through it: the bench's per-request records."""
    off = args.base_port_offset
    run_dir = work / variant
    run_dir.mkdir(parents=True, exist_ok=True)
    cfg = run_dir / "tideserve.yaml"
    cfg.write_text(config_yaml(args, variant))
    group = ProcGroup(run_dir)
    gateway = f"http://127.0.0.1:{8000 + off}"
    engines = [f"http://127.0.0.1:{30001 + off + i}" for i in range(args.engines)]
    t0 = time.monotonic()
    try:
        start_stack(group, run_dir, cfg, off, [gateway + "/v1/models"] + [
            e + "/health" for e in engines
        ])  # fmt: skip
        if variant in TIER_VARIANTS:
            group.start("kvcache", tideserve(
                "engine", "--role", "kvcache", "--port", str(30100 + off),
                "--kvcache-mib", str(args.tier_mib), "--deployment", "default",
                "--te-metadata-url", f"http://127.0.0.1:{8081 + off}/metadata",
                "--kvmeta-address", f"127.0.0.1:{50052 + off}",
                "--state-dir", str(run_dir / "kvcache"), "--log-level", "WARNING",
            ))  # fmt: skip
            wait_http(f"http://127.0.0.1:{30100 + off}/health", group, 120.0)
        target = gateway
        if variant == "sglang_cache_aware":
            target = start_sglang(group, engines)
        started = time.monotonic()
        with KVSampler(engines) as sampler:
            code = run_child(tideserve(
                "bench", "--trace", str(trace_file), "--target", target,
                "--speedup", f"{args.speedup:g}", "--trace-time", "--sessions", "first-block",
                "--timeout", "3600", "--out", str(run_dir / "bench.json"),
                "--requests-out", str(run_dir / "requests.jsonl"),
            ), cwd=ROOT, stdout=(run_dir / "bench.log").open("wb"))  # fmt: skip
        if code != 0:
            raise RuntimeError(
                f"bench exited {code}: {(run_dir / 'bench.log').read_text()[-2000:]}"
            )
        counters = kvmeta_counters(f"http://127.0.0.1:{9102 + off}/metrics")
    finally:
        group.stop(timeout_s=30.0)
    records = [json.loads(x) for x in (run_dir / "requests.jsonl").read_text().splitlines()]
    summary = json.loads((run_dir / "bench.json").read_text())
    print(f"{variant}: {len(records)} requests, {time.monotonic() - started:.0f} s replay, "
          f"{time.monotonic() - t0:.0f} s in all", file=sys.stderr)  # fmt: skip
    return {
        "records": records,
        "summary": {
            k: summary.get(k) for k in ("completed", "failed", "ttft_ms", "tpot_ms", "cpu")
        },
        "fleet_kv_used": mean(sampler.used),
        "protected_kv_share": mean(sampler.protected),
        "kvmeta": counters,
    }


def mean(xs: list[float]) -> float | None:
    return round(sum(xs) / len(xs), 4) if xs else None


def resume_figures(
    run: dict[str, Any], warm: dict[str, Any], reusable: dict[int, int]
) -> dict[str, Any]:
    def ttft(r: dict[str, Any]) -> dict[int, float]:
        return {x["index"]: x["ttft_ms"] for x in r["records"] if x["ttft_ms"] is not None
                and not x["error"]}  # fmt: skip

    mine, ref = ttft(run), ttft(warm)
    both = [i for i in reusable if i in mine and i in ref]
    cached = {x["index"]: x["cached_tokens"] or 0 for x in run["records"]}
    total = sum(reusable[i] for i in both)
    got = sum(min(cached.get(i, 0), reusable[i]) for i in both)
    p_mine, p_ref = p95([mine[i] for i in both]), p95([ref[i] for i in both])
    return {
        "resume.reuse_ratio": round(got / total, 4) if total else None,
        "resume.ttft_p95_vs_warm": round(p_mine / p_ref, 4) if p_ref else None,
        "resume.ttft_p95_ms": round(p_mine, 1),
        "warm.ttft_p95_ms": round(p_ref, 1),
        "fleet_kv_used": run["fleet_kv_used"],
        "protected_kv_share": run["protected_kv_share"],
        "failed": sum(1 for x in run["records"] if x["error"]),
        "resumed_turns": len(both),
        "kvmeta": run["kvmeta"],
        "bench": run["summary"],
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    variants = args.variants.split(",")
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        print(f"unknown variants: {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="am-live-"))
    t0 = time.monotonic()
    per: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    warm_rows: list[dict[str, Any]] = []
    trace = load_trace(args.trace)
    for text in args.slices.split(","):
        a, b = parse_slice(text)
        reqs = list(slice_trace(trace, a, b, args.max_requests).requests)
        sdir = work / f"slice-{a}-{b}"
        sdir.mkdir(parents=True, exist_ok=True)
        trace_file = sdir / "trace.jsonl"
        write_trace(reqs, args.gap_scale, trace_file)
        reusable = resumed_turns(reqs)
        warm = run_variant(args, "warm", trace_file, sdir)
        warm_rows.append({"slice": text, "bench": warm["summary"]})
        for v in variants:
            row = resume_figures(run_variant(args, v, trace_file, sdir), warm, reusable)
            per[v].append({"slice": text, **row})
    out = {
        "benchmark": "agent_memory_live",
        "command": command_line(),
        "machine": machine(),
        "trace": Path(args.trace).name,
        "slices": args.slices,
        "max_requests": args.max_requests,
        "engines": args.engines,
        "kv_blocks": args.kv_blocks,
        "gap_scale": args.gap_scale,
        "speedup": args.speedup,
        "work_dir": str(work),
        "warm": warm_rows,
        "variants": {
            v: {
                "mean": {
                    k: mean([r[k] for r in rows if isinstance(r.get(k), (int, float))])
                    for k in MEAN_KEYS
                },
                "slices": rows,
            }
            for v, rows in per.items()
        },
        "wall_s": round(time.monotonic() - t0, 1),
    }
    emit_json(out, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
