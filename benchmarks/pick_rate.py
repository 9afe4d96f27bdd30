"""Scheduling decisions per second over 64 endpoints (issue 5: "Decisions/s of the gRPC pick
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
  the JSON also counts picks whose ``kv-index`` (precise prefix) score was above 0.
- ``grpc_pick``: the same without kvmeta (``kv-index`` scores 0; the gateway-side
  approximate prefix index, TTFT cost and load scorers still run).
- ``pure_cycle``: the same core in-process, no gRPC: ``GatewayCore.pick`` + ``release``.
- ``pure_cycle_precise``: in-process, precise prefix scoring fed for real: a kvmeta
  ``PrefixIndex`` holding the workload's chains on the 64 instances is queried per request
  (``match_prefix``, timed) and its answer is given to the cycle (``prefix_matches``).

    .venv/bin/python benchmarks/pick_rate.py --endpoints 64 --duration 10 \\
        --out /tmp/pick_rate.json

Every figure comes from the run. Exit code 0 (a failed measurement is recorded with its error).
"""

from __future__ import annotations

import argparse
import asyncio
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

DEPLOYMENT = "default"
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
        help="comma list",
    )
    p.add_argument("--out", default="pick_rate.json")
    p.add_argument("--log-dir", default=None)
    return p.parse_args(argv)


def workload(trace: str, n: int, block_size: int) -> list[tuple[int, tuple[int, ...]]]:
    """(prompt_tokens, block hashes) of the first ``n`` trace requests."""
    from services.common.tokens import block_hashes

    out: list[tuple[int, tuple[int, ...]]] = []
    with open(trace, encoding="utf-8") as f:
        for line in f:
            if len(out) >= n:
                break
            row = json.loads(line)
            ids: list[int] = []
            for h in row["hash_ids"]:
                base = (int(h) * 7919) % 100_000_000
                ids.extend((base + j) & 0xFFFFFFFF for j in range(512))
            ids = ids[: int(row["input_length"])]
            out.append((len(ids), tuple(block_hashes(ids, block_size))))
    return out


def instance_ids(n: int) -> list[tuple[str, str]]:
    """(instance_id, url) of the static endpoints (never contacted with the gateway off)."""
    return [(f"127.0.0.1:{20000 + i}", f"http://127.0.0.1:{20000 + i}") for i in range(n)]


# -- in-process cycles ------------------------------------------------------------------------


def _core(args: argparse.Namespace) -> Any:
    from services.scheduler.gateway import EndpointSpec, build_core

    specs = [EndpointSpec(iid, url, "worker", deployment=DEPLOYMENT)
             for iid, url in instance_ids(args.endpoints)]  # fmt: skip
    return build_core(specs, block_size=args.block_size)


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


def pure_cycle(args: argparse.Namespace, work: list[tuple[int, tuple[int, ...]]],
               precise: bool) -> dict[str, Any]:  # fmt: skip
    from services.scheduler.routing.types import PrefixMatch, RequestView

    core = _core(args)
    index = _index(args, work) if precise else None
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
        "outcomes": kinds, "endpoints": args.endpoints, "profile": args.profile or "default",
    }  # fmt: skip
    if precise:
        out["match_prefix_share_of_time"] = round(lookup_s / wall, 3)
        out["what"] = ("in-process GatewayCore.pick+release with kvmeta PrefixIndex.match_prefix "
                       "per request feeding the precise-prefix scorer; no gRPC")  # fmt: skip
    else:
        out["what"] = "in-process GatewayCore.pick+release, no kvmeta lookup, no gRPC"
    return out


# -- gRPC ------------------------------------------------------------------------------------


async def _client(port: int, work: list[tuple[int, tuple[int, ...]]], duration: float,
                  concurrency: int, profile: str) -> dict[str, Any]:  # fmt: skip
    import grpc
    from tideserve.v1 import events_pb2, scheduler_pb2, scheduler_pb2_grpc

    reqs = [scheduler_pb2.PickRequest(deployment=DEPLOYMENT, block_hashes=list(h),
                                      prompt_tokens=t, max_tokens=128, profile=profile)
            for t, h in work]  # fmt: skip
    ok = errors = kv_scored = 0
    codes: dict[str, int] = {}
    lat: list[float] = []
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        await asyncio.wait_for(ch.channel_ready(), 30.0)
        stub = scheduler_pb2_grpc.SchedulerServiceStub(ch)
        print("ready", flush=True)  # the parent starts metering the server here
        loop = asyncio.get_running_loop()
        warm_end = loop.time() + 1.0
        end = warm_end + duration

        async def worker(k: int) -> None:
            nonlocal ok, errors, kv_scored
            i = k
            while loop.time() < end:
                measuring = loop.time() >= warm_end
                t0 = time.perf_counter()
                try:
                    resp = await stub.Pick(reqs[i % len(reqs)])
                    dt = time.perf_counter() - t0
                    if measuring and any(
                        sc.plugin == "kv-index" and sc.score > 0 for sc in resp.decode.scores
                    ):
                        kv_scored += 1
                    await stub.ReportOutcome(scheduler_pb2.ReportOutcomeRequest(
                        pick_id=resp.pick_id, outcome=events_pb2.REQUEST_OUTCOME_OK))  # fmt: skip
                    if measuring:
                        ok += 1
                        lat.append(dt)
                except grpc.aio.AioRpcError as e:
                    if measuring:
                        errors += 1
                        codes[e.code().name] = codes.get(e.code().name, 0) + 1
                i += concurrency

        await asyncio.gather(*(worker(k) for k in range(concurrency)))
    lat.sort()

    def q(p: float) -> float | None:
        return round(lat[min(len(lat) - 1, int(p * len(lat)))] * 1000, 3) if lat else None

    return {"picks_ok": ok, "errors": errors, "error_codes": codes, "seconds": duration,
            "picks_with_kv_index_score_above_0": kv_scored,
            "pick_latency_ms": {"p50": q(0.5), "p99": q(0.99)}}  # fmt: skip


def client_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="pick_rate.py _client")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--trace", required=True)
    p.add_argument("--requests", type=int, required=True)
    p.add_argument("--block-size", type=int, required=True)
    p.add_argument("--duration", type=float, required=True)
    p.add_argument("--concurrency", type=int, required=True)
    p.add_argument("--profile", default="")
    a = p.parse_args(argv)
    work = workload(a.trace, a.requests, a.block_size)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    out = asyncio.run(_client(a.port, work, a.duration, a.concurrency, a.profile))
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    out["client_cpu_during_rpcs"] = {"cpu_s": round(cpu, 2),
                                     "percent_of_one_core": round(100 * cpu / wall, 1)}  # fmt: skip
    print(json.dumps(out))
    return 0


def placements(n_requests: int, n_endpoints: int) -> list[list[int]]:
    """Endpoint indexes holding request i's chain: i % N, and every 7th also on the next."""
    return [
        [i % n_endpoints] + ([(i + 1) % n_endpoints] if i % 7 == 0 else [])
        for i in range(n_requests)
    ]


def _wait_grpc(port: int, group: ProcGroup, timeout_s: float = 60.0) -> None:
    import grpc

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        group.check()
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            try:
                grpc.channel_ready_future(ch).result(timeout=1.0)
                return
            except grpc.FutureTimeoutError:
                pass
    raise RuntimeError(f"gRPC server on port {port} not ready after {timeout_s:g}s")


def start_kvmeta(args: argparse.Namespace, work: list[tuple[int, tuple[int, ...]]],
                 group: ProcGroup, log_dir: Path) -> tuple[int, dict[str, Any]]:  # fmt: skip
    """A kvmeta process (no Redis, no Postgres) fed the workload's chains through
    IngestEvents, as the 64 engines would report them. Returns (port, ingest summary)."""
    import grpc
    from tideserve.v1 import common_pb2, events_pb2, kvmeta_pb2, kvmeta_pb2_grpc

    cfg = log_dir / "kvmeta.yaml"
    cfg.write_text(json.dumps({"kvmeta": {"metadata_http_port": 0}}), encoding="utf-8")
    port = free_port()
    group.start("kvmeta", [sys.executable, "-m", "services.kvmeta", "--config", str(cfg),
                           "--grpc-port", str(port), "--metrics-port", "0",
                           "--log-level", "WARNING"])  # fmt: skip
    _wait_grpc(port, group)
    ids = [iid for iid, _ in instance_ids(args.endpoints)]
    seqs = dict.fromkeys(ids, 0)
    batches = []
    for (_, hashes), where in zip(work, placements(len(work), len(ids)), strict=True):
        for k in where:
            iid = ids[k]
            seqs[iid] += 1
            ev = events_pb2.KVEvent(kind=events_pb2.KVEvent.KIND_BLOCK_STORED,
                                    tier=common_pb2.TIER_GPU, block_hashes=list(hashes),
                                    token_count=len(hashes) * args.block_size)  # fmt: skip
            batches.append(events_pb2.KVEventBatch(deployment=DEPLOYMENT, instance_id=iid,
                                                   epoch=1, seq=seqs[iid], events=[ev],
                                                   block_size=args.block_size))  # fmt: skip
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        stub = kvmeta_pb2_grpc.KVMetaServiceStub(ch)
        resp = stub.IngestEvents(iter(batches), timeout=120)
        listed = stub.ListIndexedInstances(
            kvmeta_pb2.ListIndexedInstancesRequest(deployment=DEPLOYMENT), timeout=10
        )
    return port, {"batches_applied": resp.batches_applied,
                  "instances_indexed": len(listed.instances)}  # fmt: skip


def grpc_pick(args: argparse.Namespace, log_dir: Path, precise: bool,
              work: list[tuple[int, tuple[int, ...]]]) -> dict[str, Any]:  # fmt: skip
    port = free_port()
    group = ProcGroup(log_dir)
    try:
        sched: dict[str, Any] = {
            "endpoints": [url for _, url in instance_ids(args.endpoints)],
            "http_port": 0, "block_size": args.block_size,
        }  # fmt: skip
        res: dict[str, Any] = {}
        if precise:
            kport, res["kvmeta_ingest"] = start_kvmeta(args, work, group, log_dir)
            sched["kvmeta_address"] = f"127.0.0.1:{kport}"
        cfg = log_dir / f"scheduler{'-precise' if precise else ''}.yaml"
        cfg.write_text(json.dumps({"scheduler": sched}), encoding="utf-8")  # JSON is YAML
        server = group.start("scheduler", [sys.executable, "-m", "services.scheduler",
                                           "--config", str(cfg), "--grpc-port", str(port),
                                           "--metrics-port", "0", "--log-level", "WARNING"])  # fmt: skip
        _wait_grpc(port, group)
        client_cmd = [sys.executable, str(Path(__file__).resolve()), "_client",
                      "--port", str(port), "--trace", args.trace,
                      "--requests", str(args.requests), "--block-size", str(args.block_size),
                      "--duration", str(args.duration), "--concurrency", str(args.concurrency),
                      "--profile", args.profile]  # fmt: skip
        client = subprocess.Popen(client_cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True)  # fmt: skip
        # The client builds its workload first, then prints "ready": meter the servers' CPU
        # from there (1 s warm-up + the measured span).
        assert client.stdout is not None
        first = client.stdout.readline()
        meter = CpuMeter([server.proc.pid])
        kv_meter = CpuMeter([c.proc.pid for c in group.children if c.name == "kvmeta"])
        out_text, err_text = client.communicate(timeout=args.duration + 180)
        if first.strip() != "ready":
            out_text = first + out_text
        server_cpu, kv_cpu = meter.read(), kv_meter.read()
        group.check()
        if client.returncode != 0:
            return {"error": err_text.strip()[-800:]}
        res.update(json.loads(out_text))
        res["decisions_per_s"] = round(res["picks_ok"] / res["seconds"], 1)
        res["scheduler_cpu_during_rpcs"] = server_cpu
        if precise:
            res["kvmeta_cpu_during_rpcs"] = kv_cpu
        res["concurrency"] = args.concurrency
        res["endpoints"] = args.endpoints
        res["profile"] = args.profile or "default"
        res["what"] = (
            "gRPC SchedulerService.Pick (+ReportOutcome per pick, not counted) on a real "
            "scheduler process, block hashes in the request; "
            + ("the scheduler asks a real kvmeta process (MatchPrefix over gRPC) before each "
               "cycle, so the kv-index precise-prefix plugin scores"
               if precise else "no kvmeta address, so the kv-index precise-prefix plugin "
               "scores 0 (approximate prefix, TTFT cost and load still run)")
        )  # fmt: skip
        return res
    except (RuntimeError, OSError, ValueError, subprocess.TimeoutExpired) as err:
        return {"error": str(err)}
    finally:
        group.stop()


def run_mode(mode: str, args: argparse.Namespace, work: list[tuple[int, tuple[int, ...]]],
             log_dir: Path) -> dict[str, Any]:  # fmt: skip
    """One measurement; a failure is returned as ``{"error": ...}``."""
    try:
        if mode == "grpc_pick":
            return grpc_pick(args, log_dir, False, work)
        if mode == "grpc_pick_precise":
            return grpc_pick(args, log_dir, True, work)
        if mode == "pure_cycle":
            return pure_cycle(args, work, precise=False)
        if mode == "pure_cycle_precise":
            return pure_cycle(args, work, precise=True)
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
