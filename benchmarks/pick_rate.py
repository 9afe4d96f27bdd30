"""Scheduling decisions per second over 64 endpoints (target: "Decisions/s of the gRPC pick
RPC per process, target >= 3,000/s with precise prefix scoring over 64 endpoints").

Workload: the first ``--requests`` prompts of the Mooncake conversation trace, turned into
token ids (each 512-token trace block id → 512 deterministic token ids, so equal ids give
equal prefixes) and chained block hashes (``services.common.tokens.block_hashes``, block
size ``--block-size``), replayed in a loop. Endpoints: ``--endpoints`` static workers.

Measurements (each labelled in the JSON exactly as what it is):

- ``grpc_pick_precise``: a real kvmeta process (no Redis/Postgres) fed the workload's chains
  through ``IngestEvents`` as the 64 engines would report them (request i on instance i % 64,
  every 7th also on the next), and a real scheduler process (``python -m services.scheduler``,
  the 64 endpoints as static settings, HTTP gateway off so no health probing or load
  scraping, ``kvmeta_address`` set) that asks kvmeta ``MatchPrefix`` before each cycle. A
  separate client process does Pick (block hashes in the request) then ReportOutcome, with
  ``--concurrency`` calls in flight, for ``--duration`` s. Decisions/s = successful Picks/s;
  the JSON also counts picks whose prefix score was above 0 (``prefix``, the default
  profile's one estimate, routed or precise; ``kv-index`` in the precise-only profile).
- ``grpc_pick``: the same without kvmeta (no precise data; the gateway-side
  approximate prefix index, TTFT cost and load scorers still run).
- ``pure_cycle``: the same core in-process, no gRPC: ``GatewayCore.pick`` + ``release``.
- ``pure_cycle_precise``: in-process, precise prefix scoring fed for real: a kvmeta
  ``PrefixIndex`` holding the workload's chains on the 64 instances is queried per request
  (``match_prefix``, timed) and its answer is given to the cycle (``prefix_matches``).
- ``grpc_pick_local``: like ``grpc_pick_precise`` but the scheduler runs with
  ``precise_source: local``: no kvmeta; an embedded Redis holds the same chains as
  ``KVEventBatch`` entries on ``ts:kv:default`` (published before the scheduler starts, which
  replays them into its local replica of the KV index), and the precise-prefix plugin reads
  that replica. With ``--kv-batches-per-s N`` the bench keeps publishing N more batches per
  second during the run (re-storing workload chains, full apply cost) so the scheduler also
  pays for following the stream.
- ``grpc_stream_local`` / ``grpc_stream_precise``: the same two set-ups, but the client uses
  the bidirectional ``PickStream`` RPC: ``--streams`` streams with ``--concurrency`` requests
  in flight in total, and each pick's outcome rides on a later request of its stream
  (``PickRequest.report_outcomes``) instead of a ``ReportOutcome`` call.
- ``pure_cycle_local``: in-process, the scheduler's local replica (``KVReplica.match``,
  timed) feeding the cycle.

    .venv/bin/python benchmarks/pick_rate.py --endpoints 64 --duration 10 \\
        --out /tmp/pick_rate.json

Every figure comes from the run. Exit code 0 (a failed measurement is recorded with its error).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Literal

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _harness import (
    MOONCAKE_CONVERSATION,
    CpuMeter,
    ProcGroup,
    command_line,
    free_port,
    machine,
)
from _pick_client import client_main
from _pick_feeds import (
    DEPLOYMENT,
    _LivePublisher,
    _stored_batches,
    _wait_grpc,
    instance_ids,
    placements,
    start_kvmeta,
    start_redis_fed,
    workload,
)

TIER_NAMES: dict[int, Literal["gpu", "cpu", "ssd", "remote"]] = {
    1: "gpu",
    2: "cpu",
    3: "ssd",
    4: "remote",
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--endpoints", type=int, default=64)
    p.add_argument("--trace", default=str(MOONCAKE_CONVERSATION))
    p.add_argument("--requests", type=int, default=300, help="distinct trace prompts to cycle")
    p.add_argument("--block-size", type=int, default=64)
    p.add_argument("--profile", default="", help="scheduler profile ('' = default)")
    p.add_argument(
        "--profiles-file", default="",
        help="scheduler profiles YAML ('' = the shipped default_profiles.yaml), e.g. "
             "benchmarks/profiles_precise_only.yaml",
    )  # fmt: skip
    p.add_argument("--duration", type=float, default=10.0, help="seconds per measurement")
    p.add_argument(
        "--repeats", type=int, default=3,
        help="runs per mode; the JSON gives each run, the median and the best (noise on a "
             "shared machine only ever lowers a rate)",
    )  # fmt: skip
    p.add_argument("--concurrency", type=int, default=32, help="gRPC calls in flight")
    p.add_argument(
        "--modes",
        default="grpc_pick_precise,grpc_pick,pure_cycle,pure_cycle_precise",
        help="comma list; also grpc_pick_local, grpc_stream_local, grpc_stream_precise, "
        "pure_cycle_local",
    )
    p.add_argument("--streams", type=int, default=4, help="PickStream streams (stream modes)")
    p.add_argument(
        "--kv-batches-per-s", type=float, default=0.0,
        help="local modes: KV event batches published per second during the run",
    )  # fmt: skip
    p.add_argument("--out", default="pick_rate.json")
    p.add_argument("--log-dir", default=None)
    return p.parse_args(argv)


# -- in-process cycles ------------------------------------------------------------------------


def _core(args: argparse.Namespace) -> Any:
    from services.common.scheduling import EndpointSpec, build_core

    specs = [EndpointSpec(iid, url, "worker", deployment=DEPLOYMENT)
             for iid, url in instance_ids(args.endpoints)]  # fmt: skip
    profiles = Path(args.profiles_file).resolve() if args.profiles_file else None
    return build_core(specs, block_size=args.block_size, profiles=profiles)


def _index(args: argparse.Namespace, work: list[tuple[int, tuple[int, ...]]]) -> Any:
    """A kvmeta PrefixIndex with request i's chain stored on instance i % N (and every 7th
    also on the next one), as engines would report after serving them."""
    from services.kvmeta.index import STORED, BlockEvent, PrefixIndex

    index = PrefixIndex()
    ids = [iid for iid, _ in instance_ids(args.endpoints)]
    seqs = dict.fromkeys(ids, 0)
    for (_, hashes), where in zip(work, placements(len(work), len(ids)), strict=True):
        for iid in (ids[k] for k in where):
            seqs[iid] += 1
            index.apply_batch(DEPLOYMENT, iid, 1, seqs[iid],
                              [BlockEvent(STORED, list(hashes))], 0.0)  # fmt: skip
    return index


def _replica(args: argparse.Namespace, work: list[tuple[int, tuple[int, ...]]]) -> Any:
    """The scheduler's local KV replica holding the same placements as :func:`_index`."""
    from services.scheduler.feeds.kv_replica_core import STORED, KVReplica

    replica = KVReplica()
    for iid, seq, hashes in _stored_batches(args, work):
        replica.apply(iid, 1, seq, [_Stored(STORED, hashes)])
    return replica


class _Stored:
    __slots__ = ("block_hashes", "kind", "lora", "tenant", "tier")

    def __init__(self, kind: int, hashes: tuple[int, ...]) -> None:
        self.kind, self.block_hashes, self.tier, self.tenant, self.lora = kind, hashes, 1, "", ""


def pure_cycle(args: argparse.Namespace, work: list[tuple[int, tuple[int, ...]]],
               source: str) -> dict[str, Any]:  # fmt: skip
    """``source``: "off" (no lookup), "kvmeta" (kvmeta's PrefixIndex in-process) or
    "local" (the scheduler's KVReplica)."""
    from services.common.routing.types import PrefixMatch, RequestView

    core = _core(args)
    index = _index(args, work) if source == "kvmeta" else None
    replica = _replica(args, work) if source == "local" else None
    lookup_s = 0.0
    n = 0
    kinds: dict[str, int] = {}
    start = time.perf_counter()
    end = start + args.duration
    while True:
        now = time.perf_counter()
        if now >= end:
            break
        tokens, hashes = work[n % len(work)]
        matches = None
        if index is not None:
            t0 = time.perf_counter()
            found = index.match_prefix(DEPLOYMENT, "", hashes)
            matches = {
                m.instance_id: PrefixMatch(
                    m.matched_blocks, {TIER_NAMES.get(t, "gpu"): b for t, b in m.tiers.items()}
                )
                for m in found
            }
            lookup_s += time.perf_counter() - t0
        elif replica is not None:
            t0 = time.perf_counter()
            matches = replica.match(hashes)
            lookup_s += time.perf_counter() - t0
        pid = f"p{n}"
        view = RequestView(request_id=pid, prompt_tokens=tokens, block_hashes=hashes,
                           block_size=args.block_size, max_tokens=128,
                           prefix_matches=matches)  # fmt: skip
        d = core.pick(view, now, pid, args.profile)
        kinds[type(d).__name__] = kinds.get(type(d).__name__, 0) + 1
        core.release(pid)
        n += 1
    wall = time.perf_counter() - start
    out: dict[str, Any] = {
        "decisions": n, "seconds": round(wall, 3), "decisions_per_s": round(n / wall, 1),
        "outcomes": kinds, "endpoints": args.endpoints, "profile": _profile_label(args),
    }  # fmt: skip
    if source != "off":
        out["match_prefix_share_of_time"] = round(lookup_s / wall, 3)
    if source == "kvmeta":
        out["what"] = ("in-process GatewayCore.pick+release with kvmeta PrefixIndex.match_prefix "
                       "per request feeding the precise-prefix scorer; no gRPC")  # fmt: skip
    elif source == "local":
        out["what"] = ("in-process GatewayCore.pick+release with the scheduler's local KV "
                       "replica (KVReplica.match) per request feeding the precise-prefix "
                       "scorer; no gRPC, no Redis")  # fmt: skip
    else:
        out["what"] = "in-process GatewayCore.pick+release, no kvmeta lookup, no gRPC"
    return out


# -- gRPC ------------------------------------------------------------------------------------


def grpc_pick(args: argparse.Namespace, log_dir: Path, source: str,
              work: list[tuple[int, tuple[int, ...]]], rpc: str = "unary") -> dict[str, Any]:  # fmt: skip
    """``source``: "off" (no precise data), "kvmeta" (MatchPrefix per pick to a kvmeta
    process) or "local" (the scheduler's replica fed from Redis). ``rpc``: "unary" (Pick +
    ReportOutcome) or "stream" (PickStream, outcomes on later requests)."""
    port = free_port()
    group = ProcGroup(log_dir)
    redis_server = None
    publisher = None
    try:
        sched: dict[str, Any] = {
            "endpoints": [url for _, url in instance_ids(args.endpoints)],
            "http_port": 0, "block_size": args.block_size,
        }  # fmt: skip
        if args.profiles_file:
            sched["profiles_file"] = str(Path(args.profiles_file).resolve())
        res: dict[str, Any] = {}
        if source == "kvmeta":
            kport, res["kvmeta_ingest"] = start_kvmeta(args, work, group, log_dir)
            sched["kvmeta_address"] = f"127.0.0.1:{kport}"
        elif source == "local":
            redis_server, res["kv_stream"] = start_redis_fed(args, work, log_dir)
            sched.update(precise_source="local", redis_url=redis_server.url,
                         request_records=False, load_stream=False,
                         membership_stream=False)  # fmt: skip
        cfg = log_dir / f"scheduler-{source}.yaml"
        cfg.write_text(json.dumps({"scheduler": sched}), encoding="utf-8")  # JSON is YAML
        server = group.start("scheduler", [sys.executable, "-m", "services.scheduler",
                                           "--config", str(cfg), "--grpc-port", str(port),
                                           "--metrics-port", "0", "--log-level", "WARNING"])  # fmt: skip
        _wait_grpc(port, group)
        client_cmd = [sys.executable, str(Path(__file__).resolve()), "_client",
                      "--port", str(port), "--trace", args.trace,
                      "--requests", str(args.requests), "--block-size", str(args.block_size),
                      "--duration", str(args.duration), "--concurrency", str(args.concurrency),
                      "--profile", args.profile, "--rpc", rpc,
                      "--streams", str(args.streams)]  # fmt: skip
        client = subprocess.Popen(client_cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True)  # fmt: skip
        # The client builds its workload first, then prints "ready": meter the servers' CPU
        # from there (1 s warm-up + the measured span).
        assert client.stdout is not None
        first = client.stdout.readline()
        meter = CpuMeter([server.proc.pid])
        kv_meter = CpuMeter([c.proc.pid for c in group.children if c.name == "kvmeta"])
        redis_meter = CpuMeter([redis_server.pid] if redis_server is not None else [])
        if redis_server is not None and args.kv_batches_per_s > 0:
            publisher = _LivePublisher(redis_server.url, args, work, args.kv_batches_per_s)
            publisher.start()
        out_text, err_text = client.communicate(timeout=args.duration + 180)
        if publisher is not None:
            publisher.stop()
            res["kv_batches_published_during_run"] = publisher.published
        if first.strip() != "ready":
            out_text = first + out_text
        server_cpu, kv_cpu, redis_cpu = meter.read(), kv_meter.read(), redis_meter.read()
        group.check()
        if client.returncode != 0:
            return {"error": err_text.strip()[-800:]}
        res.update(json.loads(out_text))
        res["decisions_per_s"] = round(res["picks_ok"] / res["seconds"], 1)
        res["scheduler_cpu_during_rpcs"] = server_cpu
        if source == "kvmeta":
            res["kvmeta_cpu_during_rpcs"] = kv_cpu
        if source == "local":
            res["redis_cpu_during_rpcs"] = redis_cpu
        res["concurrency"] = args.concurrency
        if rpc == "stream":
            res["streams"] = args.streams
        res["endpoints"] = args.endpoints
        res["profile"] = _profile_label(args)
        res["what"] = _what(source, rpc, args)
        return res
    except (RuntimeError, OSError, ValueError, subprocess.TimeoutExpired) as err:
        return {"error": str(err)}
    finally:
        if publisher is not None:
            publisher.stop()
        group.stop()
        if redis_server is not None:
            redis_server.stop()


def _profile_label(args: argparse.Namespace) -> str:
    name = args.profile or "default"
    return f"{name} of {args.profiles_file}" if args.profiles_file else name


def _what(source: str, rpc: str, args: argparse.Namespace) -> str:
    call = ("gRPC SchedulerService.Pick (+ReportOutcome per pick, not counted)" if rpc == "unary"
            else f"gRPC SchedulerService.PickStream ({args.streams} bidi streams, "
                 f"{args.concurrency} requests in flight in total; each pick's outcome rides "
                 "on a later request of its stream, no ReportOutcome calls)")  # fmt: skip
    data = {
        "kvmeta": "the scheduler asks a real kvmeta process (MatchPrefix over gRPC) before "
                  "each cycle, so the prefix estimate holds precise matches",
        "local": "precise_source=local: the scheduler's own replica of the KV index, replayed "
                 "from KVEventBatch entries on ts:kv:default in an embedded Redis (no kvmeta), "
                 "feeds the prefix estimate's precise matches"
                 + (f"; {args.kv_batches_per_s:g} more batches/s published during the run"
                    if args.kv_batches_per_s > 0 else "; no new KV events during the run"),
        "off": "no kvmeta address, so no precise matches "
               "(approximate prefix, TTFT cost and load still run)",
    }[source]  # fmt: skip
    return f"{call} on a real scheduler process, block hashes in the request; {data}"


GRPC_MODES = {
    "grpc_pick": ("off", "unary"),
    "grpc_pick_precise": ("kvmeta", "unary"),
    "grpc_pick_local": ("local", "unary"),
    "grpc_stream_precise": ("kvmeta", "stream"),
    "grpc_stream_local": ("local", "stream"),
}
PURE_MODES = {"pure_cycle": "off", "pure_cycle_precise": "kvmeta", "pure_cycle_local": "local"}


def run_mode(mode: str, args: argparse.Namespace, work: list[tuple[int, tuple[int, ...]]],
             log_dir: Path) -> dict[str, Any]:  # fmt: skip
    """One measurement; a failure is returned as ``{"error": ...}``."""
    try:
        if mode in GRPC_MODES:
            source, rpc = GRPC_MODES[mode]
            return grpc_pick(args, log_dir, source, work, rpc)
        if mode in PURE_MODES:
            return pure_cycle(args, work, PURE_MODES[mode])
        return {"error": f"unknown mode {mode!r}"}
    except Exception as err:  # record it, keep measuring the others
        return {"error": f"{type(err).__name__}: {err}"}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_client"]:
        return client_main(argv[1:])
    args = parse_args(argv)
    log_dir = Path(args.log_dir or tempfile.mkdtemp(prefix="tideserve-pick-rate-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {"benchmark": "pick_rate", "command": command_line(),
                               "machine": machine(), "target": ">= 3000 decisions/s with "
                               "precise prefix scoring over 64 endpoints"}  # fmt: skip
    work = workload(args.trace, args.requests, args.block_size)
    summary["workload"] = {
        "trace": args.trace, "requests": len(work), "block_size": args.block_size,
        "mean_blocks": round(sum(len(h) for _, h in work) / max(1, len(work)), 1),
    }  # fmt: skip
    for mode in [m.strip() for m in args.modes.split(",") if m.strip()]:
        runs: list[dict[str, Any]] = []
        for k in range(args.repeats):
            print(f"[{mode}] run {k + 1}/{args.repeats}", file=sys.stderr)
            runs.append(run_mode(mode, args, work, log_dir))
        rates = sorted(r["decisions_per_s"] for r in runs if "decisions_per_s" in r)
        summary[mode] = {
            "decisions_per_s_median": rates[len(rates) // 2] if rates else None,
            "decisions_per_s_best": rates[-1] if rates else None,
            "what": next((r["what"] for r in runs if "what" in r), None),
            "runs": runs,
        }
    text = json.dumps(summary, indent=2)
    Path(args.out).write_text(text + "\n", encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
