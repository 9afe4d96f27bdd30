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
import asyncio
import json
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
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
    from services.scheduler.core import EndpointSpec, build_core

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


def _stored_batches(args: argparse.Namespace, work: list[tuple[int, tuple[int, ...]]]
                    ) -> list[tuple[str, int, tuple[int, ...]]]:  # fmt: skip
    """(instance, seq, chain) of the seed batches: request i on instance i % N, every 7th
    also on the next one; seqs contiguous per instance from 1."""
    ids = [iid for iid, _ in instance_ids(args.endpoints)]
    seqs = dict.fromkeys(ids, 0)
    out = []
    for (_, hashes), where in zip(work, placements(len(work), len(ids)), strict=True):
        for k in where:
            seqs[ids[k]] += 1
            out.append((ids[k], seqs[ids[k]], hashes))
    return out


def pure_cycle(args: argparse.Namespace, work: list[tuple[int, tuple[int, ...]]],
               source: str) -> dict[str, Any]:  # fmt: skip
    """``source``: "off" (no lookup), "kvmeta" (kvmeta's PrefixIndex in-process) or
    "local" (the scheduler's KVReplica)."""
    from services.scheduler.routing.types import PrefixMatch, RequestView

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


async def _client(port: int, work: list[tuple[int, tuple[int, ...]]], duration: float,
                  concurrency: int, profile: str, rpc: str = "unary",
                  streams: int = 1) -> dict[str, Any]:  # fmt: skip
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

        def scored(resp: Any) -> bool:
            return any(sc.plugin == "kv-index" and sc.score > 0 for sc in resp.decode.scores)

        async def worker(k: int) -> None:
            nonlocal ok, errors, kv_scored
            i = k
            while loop.time() < end:
                measuring = loop.time() >= warm_end
                t0 = time.perf_counter()
                try:
                    resp = await stub.Pick(reqs[i % len(reqs)])
                    dt = time.perf_counter() - t0
                    if measuring and scored(resp):
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

        async def stream_worker(k: int, depth: int) -> None:
            """One PickStream with ``depth`` requests in flight; each answer's outcome rides
            on the next request written (PickRequest.report_outcomes)."""
            nonlocal ok, errors, kv_scored
            call = stub.PickStream()
            sent: deque[float] = deque()
            i = k

            async def send(outcome_of: str) -> None:
                nonlocal i
                r = reqs[i % len(reqs)]
                if outcome_of:
                    r = scheduler_pb2.PickRequest()
                    r.CopyFrom(reqs[i % len(reqs)])
                    r.report_outcomes.add(pick_id=outcome_of,
                                          outcome=events_pb2.REQUEST_OUTCOME_OK)  # fmt: skip
                sent.append(time.perf_counter())
                await call.write(r)
                i += streams

            for _ in range(depth):
                await send("")
            while sent:
                resp = await call.read()
                if resp is grpc.aio.EOF:
                    break
                dt = time.perf_counter() - sent.popleft()
                measuring = warm_end <= loop.time()
                if resp.HasField("error"):
                    if measuring:
                        errors += 1
                        name = _code_of(resp.error.code).name
                        codes[name] = codes.get(name, 0) + 1
                elif measuring:
                    ok += 1
                    lat.append(dt)
                    if scored(resp):
                        kv_scored += 1
                if loop.time() < end:
                    await send(resp.pick_id)
            await call.done_writing()

        if rpc == "stream":
            depth = max(1, concurrency // streams)
            await asyncio.gather(*(stream_worker(k, depth) for k in range(streams)))
        else:
            await asyncio.gather(*(worker(k) for k in range(concurrency)))
    lat.sort()

    def q(p: float) -> float | None:
        return round(lat[min(len(lat) - 1, int(p * len(lat)))] * 1000, 3) if lat else None

    return {"picks_ok": ok, "errors": errors, "error_codes": codes, "seconds": duration,
            "picks_with_kv_index_score_above_0": kv_scored,
            "pick_latency_ms": {"p50": q(0.5), "p99": q(0.99)}}  # fmt: skip


def _code_of(number: int) -> Any:
    import grpc

    return next((c for c in grpc.StatusCode if c.value[0] == number), grpc.StatusCode.UNKNOWN)


def client_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="pick_rate.py _client")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--trace", required=True)
    p.add_argument("--requests", type=int, required=True)
    p.add_argument("--block-size", type=int, required=True)
    p.add_argument("--duration", type=float, required=True)
    p.add_argument("--concurrency", type=int, required=True)
    p.add_argument("--profile", default="")
    p.add_argument("--rpc", choices=("unary", "stream"), default="unary")
    p.add_argument("--streams", type=int, default=1)
    a = p.parse_args(argv)
    work = workload(a.trace, a.requests, a.block_size)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    out = asyncio.run(_client(a.port, work, a.duration, a.concurrency, a.profile, a.rpc,
                              a.streams))  # fmt: skip
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


def start_redis_fed(args: argparse.Namespace, work: list[tuple[int, tuple[int, ...]]],
                    log_dir: Path) -> tuple[Any, dict[str, Any]]:  # fmt: skip
    """An embedded Redis holding the workload's chains as KVEventBatch entries on
    ``ts:kv:default``, as the 64 engines would have published them. Returns (server, info)."""
    import redis
    from tideserve.v1 import common_pb2, events_pb2

    from services.common.embedded import start_redis
    from services.common.streams import encode_entry, stream_name

    server = start_redis(Path(tempfile.mkdtemp(prefix="redis-", dir=log_dir)), 0)
    client = redis.Redis.from_url(server.url)
    stream = stream_name("ts", "kv", DEPLOYMENT)
    pipe = client.pipeline(transaction=False)
    batches = _stored_batches(args, work)
    for iid, seq, hashes in batches:
        ev = events_pb2.KVEvent(kind=events_pb2.KVEvent.KIND_BLOCK_STORED,
                                tier=common_pb2.TIER_GPU, block_hashes=list(hashes),
                                token_count=len(hashes) * args.block_size)  # fmt: skip
        b = events_pb2.KVEventBatch(deployment=DEPLOYMENT, instance_id=iid, epoch=1, seq=seq,
                                    events=[ev], block_size=args.block_size)  # fmt: skip
        pipe.xadd(stream, encode_entry(b))  # type: ignore[arg-type]
    pipe.execute()
    client.close()
    return server, {"batches_published": len(batches), "stream": stream}


class _LivePublisher:
    """Publishes ``rate`` more KVEventBatch entries per second on the KV stream from a
    thread of this (bench) process: re-stored workload chains with the next seqs of their
    instances, so the scheduler's replica applies them in full."""

    def __init__(self, url: str, args: argparse.Namespace,
                 work: list[tuple[int, tuple[int, ...]]], rate: float) -> None:  # fmt: skip
        self.url, self.rate, self.published = url, rate, 0
        self.batches = _stored_batches(args, work)
        self.seqs: dict[str, int] = {}
        for iid, seq, _ in self.batches:
            self.seqs[iid] = max(self.seqs.get(iid, 0), seq)
        self.block_size = args.block_size
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kv-publisher")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        import redis
        from tideserve.v1 import common_pb2, events_pb2

        from services.common.streams import encode_entry, stream_name

        client = redis.Redis.from_url(self.url)
        stream = stream_name("ts", "kv", DEPLOYMENT)
        t0, k = time.monotonic(), 0
        try:
            while not self._stop.is_set():
                due = int((time.monotonic() - t0) * self.rate) - self.published
                if due <= 0:
                    self._stop.wait(0.01)
                    continue
                pipe = client.pipeline(transaction=False)
                for _ in range(min(due, 200)):
                    iid, _, hashes = self.batches[k % len(self.batches)]
                    k += 1
                    self.seqs[iid] += 1
                    ev = events_pb2.KVEvent(kind=events_pb2.KVEvent.KIND_BLOCK_STORED,
                                            tier=common_pb2.TIER_GPU, block_hashes=list(hashes))  # fmt: skip
                    b = events_pb2.KVEventBatch(deployment=DEPLOYMENT, instance_id=iid, epoch=1,
                                                seq=self.seqs[iid], events=[ev],
                                                block_size=self.block_size)  # fmt: skip
                    pipe.xadd(stream, encode_entry(b), maxlen=100_000, approximate=True)  # type: ignore[arg-type]
                    self.published += 1
                pipe.execute()
        finally:
            client.close()


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
                  "each cycle, so the kv-index precise-prefix plugin scores",
        "local": "precise_source=local: the scheduler's own replica of the KV index, replayed "
                 "from KVEventBatch entries on ts:kv:default in an embedded Redis (no kvmeta), "
                 "feeds the kv-index precise-prefix plugin"
                 + (f"; {args.kv_batches_per_s:g} more batches/s published during the run"
                    if args.kv_batches_per_s > 0 else "; no new KV events during the run"),
        "off": "no kvmeta address, so the kv-index precise-prefix plugin scores 0 "
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
