"""kvmeta core benchmark: prefix-index ingest rate, MatchPrefix latency, memory per entry,
snapshot/restore time, and object-master operation rates. Prints one JSON object.

Workload (synthetic, deterministic by --seed): ``--instances`` instances of one deployment,
one tenant. ``--families`` shared "system prompt" chains of ``--shared-blocks`` blocks; each
session is a family prefix plus a unique tail, ``--session-blocks`` blocks in all, placed on
1 instance (80 %), 2 (15 %) or 4 (5 %) instances. Sessions are added until the index holds
``--entries`` (block, instance) entries. Ingest batches hold ``--events-per-batch`` STORED
events of ``--blocks-per-event`` blocks. Queries are prompts of ``--session-blocks`` blocks
taken from a random stored session, cut at a random point and continued with unseen blocks.

Usage:
    .venv/bin/python benchmarks/kvmeta_bench.py                      # full: 10M entries
    .venv/bin/python benchmarks/kvmeta_bench.py --entries 1000000    # quick
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psutil

from services.kvmeta.index import STORED, BlockEvent, PrefixIndex
from services.kvmeta.objects import ObjectMaster, ReplicaConfig, SegmentSpec


def _pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(p / 100 * len(s)))]


Batch = tuple[str, int, list[list[int]]]  # (instance, seq, block-hash lists of STORED events)


def gen_batches(
    args: argparse.Namespace, rng: random.Random, sessions: list[tuple[list[int], list[str]]]
) -> Iterator[Batch]:
    """The workload's ingest batches (see module doc); fills ``sessions`` for queries."""
    inst_ids = [f"i{n:04d}" for n in range(args.instances)]
    seqs = dict.fromkeys(inst_ids, 0)
    families = [
        [rng.getrandbits(64) | 1 for _ in range(args.shared_blocks)] for _ in range(args.families)
    ]
    family_holders: dict[int, set[str]] = {f: set() for f in range(args.families)}
    tail_len = args.session_blocks - args.shared_blocks
    bpe = args.blocks_per_event
    pending: dict[str, list[list[int]]] = {i: [] for i in inst_ids}
    entries = 0

    def store(iid: str, hashes: list[int]) -> Iterator[Batch]:
        for k in range(0, len(hashes), bpe):
            pending[iid].append(hashes[k : k + bpe])
            if len(pending[iid]) >= args.events_per_batch:
                seqs[iid] += 1
                yield iid, seqs[iid], pending[iid]
                pending[iid] = []

    while entries < args.entries:
        fam = rng.randrange(args.families)
        r = rng.random()
        holders = rng.sample(inst_ids, 1 if r < 0.8 else (2 if r < 0.95 else 4))
        tail = [rng.getrandbits(64) | 1 for _ in range(tail_len)]
        for iid in holders:
            if iid not in family_holders[fam]:
                family_holders[fam].add(iid)
                yield from store(iid, families[fam])
                entries += len(families[fam])
            yield from store(iid, tail)
            entries += tail_len
        if len(sessions) < 20_000:
            sessions.append((families[fam] + tail, holders))
        elif rng.random() < 0.05:
            sessions[rng.randrange(len(sessions))] = (families[fam] + tail, holders)
    for iid in inst_ids:
        if pending[iid]:
            seqs[iid] += 1
            yield iid, seqs[iid], pending[iid]


def build_index(
    args: argparse.Namespace, rng: random.Random
) -> tuple[PrefixIndex, dict[str, object]]:
    idx = PrefixIndex()
    sessions: list[tuple[list[int], list[str]]] = []
    block_events = 0
    apply_s = 0.0
    for iid, seq, lists in gen_batches(args, rng, sessions):
        evs = [BlockEvent(STORED, h, 1, "t0") for h in lists]
        block_events += sum(len(h) for h in lists)
        t0 = time.perf_counter()
        idx.apply_batch("bench", iid, 1, seq, evs, 0.0)
        apply_s += time.perf_counter() - t0
    stats: dict[str, object] = {
        "entries": idx.entry_count(),
        "distinct_blocks": sum(
            len(d)
            for dep in idx._deps.values()
            for sp in dep.state.spaces.values()
            for d in sp.values()
        ),
        "block_events": block_events,
        "ingest_seconds": round(apply_s, 3),
        "ingest_block_events_per_s": round(block_events / apply_s),
    }
    idx._bench_sessions = sessions  # type: ignore[attr-defined]
    return idx, stats


def bench_match(
    idx: PrefixIndex, args: argparse.Namespace, rng: random.Random
) -> dict[str, object]:
    sessions = idx._bench_sessions  # type: ignore[attr-defined]
    lat: list[float] = []
    cpu: list[float] = []
    matched: list[int] = []
    n_inst: list[int] = []
    for _ in range(args.queries):
        hashes, _holders = sessions[rng.randrange(len(sessions))]
        cut = rng.randrange(1, len(hashes) + 1)
        prompt = hashes[:cut] + [rng.getrandbits(64) | 1 for _ in range(len(hashes) - cut)]
        t0, c0 = time.perf_counter(), time.thread_time()
        res = idx.match_prefix("bench", "t0", prompt)
        lat.append((time.perf_counter() - t0) * 1000)
        cpu.append((time.thread_time() - c0) * 1000)
        matched.append(res[0].matched_blocks if res else 0)
        n_inst.append(len(res))
    return {
        "queries": args.queries,
        "prompt_blocks": args.session_blocks,
        "p50_ms": round(_pct(lat, 50), 4),
        "p99_ms": round(_pct(lat, 99), 4),
        "max_ms": round(max(lat), 4),
        # CPU time of the calling thread: excludes time the (shared) machine ran others
        "cpu_p50_ms": round(_pct(cpu, 50), 4),
        "cpu_p99_ms": round(_pct(cpu, 99), 4),
        "gc_frozen": args.gc_freeze,
        "mean_best_match_blocks": round(sum(matched) / len(matched), 1),
        "mean_instances_returned": round(sum(n_inst) / len(n_inst), 1),
    }


def bench_snapshot(idx: PrefixIndex) -> dict[str, object]:
    t0 = time.perf_counter()
    blob = idx.snapshot()
    t1 = time.perf_counter()
    again = PrefixIndex.restore(blob)
    t2 = time.perf_counter()
    assert again.entry_count() == idx.entry_count()
    return {
        "snapshot_bytes": len(blob),
        "snapshot_s": round(t1 - t0, 3),
        "restore_s": round(t2 - t1, 3),
    }


def bench_objects(n: int) -> dict[str, object]:
    om = ObjectMaster()
    for s in range(8):
        om.mount_segment(
            "bench", SegmentSpec(f"seg{s}", f"i{s}", 2, 1 << 40, f"127.0.0.1:{17000 + s}"), 0.0
        )
    cfg = ReplicaConfig(replica_num=1, policy="free_ratio_first")
    t0 = time.perf_counter()
    for k in range(n):
        om.put_start("bench", "t0", f"k{k}", 4096, cfg, 0.0)
        om.put_end("bench", "t0", f"k{k}", 0.0)
    t1 = time.perf_counter()
    for k in range(n):
        om.get_replica_list("bench", "t0", f"k{k}", 1.0)
    t2 = time.perf_counter()
    return {
        "objects": n,
        "put_start_end_per_s": round(n / (t1 - t0)),
        "get_replica_list_per_s": round(n / (t2 - t1)),
    }


def _start_service(
    tmp: Path, port: int, pg: str | None, rd: str | None, prefix: str
) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("TIDESERVE_")}
    env.update(
        {
            "TIDESERVE_METADATA_HTTP_PORT": "0",
            "TIDESERVE_STREAM_PREFIX": prefix,
            "TIDESERVE_KVMETA__CHECKPOINT_INTERVAL_S": "2",
            "TIDESERVE_LOG_FORMAT": "text",
        }
    )
    args = ["--grpc-port", str(port), "--metrics-port", "0"]
    args += ["--postgres-url", pg] if pg else []
    args += ["--redis-url", rd] if rd else []
    with (tmp / "kvmeta.stderr").open("ab") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "services.kvmeta", *args],
            cwd=tmp,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )


def _wait(pred: Callable[[], bool], what: str, timeout: float = 600.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if pred():
                return
        except Exception:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.02)


def _grpc_object_ops(stub: Any, n: int) -> dict[str, object]:
    """Sequential PutStart+PutEnd, then GetReplicaList, over gRPC (one client)."""
    from tideserve.v1 import kvmeta_pb2

    seg = kvmeta_pb2.Segment(
        name="s0", instance_id="i0", tier=2, capacity_bytes=1 << 40, transfer_address="x:1"
    )
    stub.MountSegment(kvmeta_pb2.MountSegmentRequest(deployment="bench", segment=seg))
    q0 = time.perf_counter()
    for k in range(n):
        stub.PutStart(kvmeta_pb2.PutStartRequest(deployment="bench", key=f"k{k}", size=4096))
        stub.PutEnd(kvmeta_pb2.PutEndRequest(deployment="bench", key=f"k{k}"))
    q1 = time.perf_counter()
    for k in range(n):
        stub.GetReplicaList(kvmeta_pb2.GetReplicaListRequest(deployment="bench", key=f"k{k}"))
    q2 = time.perf_counter()
    return {
        "objects": n,
        "put_start_end_per_s": round(n / (q1 - q0)),
        "get_replica_list_per_s": round(n / (q2 - q1)),
    }


def bench_vs_mooncake(n: int) -> dict[str, object]:
    """kvmeta (memory only, no Postgres) vs ``mooncake_master`` driven by its Python store
    client, same sequence: put session start+end (allocation and commit, no data moved) and
    replica lookup, one synchronous client. Skipped (with the reason) if Mooncake is missing.
    """
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from tideserve.v1 import kvmeta_pb2_grpc

    from services.common.embedded import free_port

    master = Path(sys.executable).parent / "mooncake_master"
    try:
        from mooncake.store import MooncakeDistributedStore
    except ImportError as exc:
        return {"skipped": f"mooncake-transfer-engine(-non-cuda) not importable: {exc}"}
    if not master.exists():
        return {"skipped": f"{master} not found"}
    out: dict[str, object] = {}
    tmp = Path(tempfile.mkdtemp(prefix="kvmeta-vs-mc-"))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        port = free_port()
        procs.append(_start_service(tmp, port, None, None, "vsmc"))
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            health = health_pb2_grpc.HealthStub(ch)
            req = health_pb2.HealthCheckRequest(service="")
            _wait(lambda: health.Check(req, timeout=2).status == 1, "kvmeta (memory only) up")
            out["kvmeta_grpc_memory_only"] = _grpc_object_ops(
                kvmeta_pb2_grpc.KVMetaServiceStub(ch), n
            )
        rpc, http = free_port(), free_port()
        flags = [f"--rpc_port={rpc}", "--rpc_address=127.0.0.1", f"--metrics_port={free_port()}"]
        flags += ["--enable_http_metadata_server=true", "--http_metadata_server_host=127.0.0.1"]
        flags += [f"--http_metadata_server_port={http}"]
        with (tmp / "master.log").open("wb") as log:
            procs.append(subprocess.Popen([str(master), *flags], stdout=log, stderr=log, cwd=tmp))
        store = MooncakeDistributedStore()
        meta, addr = f"http://127.0.0.1:{http}/metadata", f"127.0.0.1:{rpc}"
        _wait(
            lambda: store.setup("127.0.0.1", meta, 256 << 20, 16 << 20, "tcp", "", addr) == 0,
            "mooncake store client setup",
            timeout=60,
        )
        q0 = time.perf_counter()
        for k in range(n):
            assert store.batch_put_session_start([f"k{k}"], [4096]) == [0]
            assert store.batch_put_session_end([f"k{k}"]) == [0]
        q1 = time.perf_counter()
        for k in range(n):
            assert store.get_replica_desc(f"k{k}")
        q2 = time.perf_counter()
        store.close()
        out["mooncake_master"] = {
            "objects": n,
            "put_start_end_per_s": round(n / (q1 - q0)),
            "get_replica_list_per_s": round(n / (q2 - q1)),
        }
        out["comparable"] = (
            "same sequential metadata operations from one client process to one master process; "
            "kvmeta: Python grpc.aio + protobuf, memory only here (write-through to Postgres in "
            "'service.grpc_objects'); Mooncake: C++ master over its coro_rpc with a C++ client. "
            "Not compared: data transfer, HA, concurrency."
        )
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        if not os.environ.get("KVBENCH_KEEP"):
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def bench_service(args: argparse.Namespace) -> dict[str, object]:
    """Through a real kvmeta process on real Postgres + Redis (embedded unless URLs given)."""
    import grpc
    import psycopg
    import redis
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from tideserve.v1 import events_pb2, kvmeta_pb2, kvmeta_pb2_grpc

    from services.common.embedded import free_port, start_postgres, start_redis
    from services.common.streams import encode_entry, stream_name

    tmp = Path(tempfile.mkdtemp(prefix="kvmeta-bench-"))
    tmp.chmod(0o755)
    stops: list[Callable[[], None]] = []
    proc: subprocess.Popen[bytes] | None = None
    out: dict[str, object] = {}
    try:
        pg_url, rd_url = args.postgres_url, args.redis_url
        if not pg_url:
            pg = start_postgres(tmp / "pg")
            stops.append(pg.stop)
            pg_url = pg.url
        if not rd_url:
            rs = start_redis(tmp / "redis", 0)
            stops.append(rs.stop)
            rd_url = rs.url
        prefix = f"kvbench{os.getpid()}"
        stream = stream_name(prefix, "kv", "bench")
        port = free_port()
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        stub = kvmeta_pb2_grpc.KVMetaServiceStub(channel)
        health = health_pb2_grpc.HealthStub(channel)

        def serving() -> bool:
            req = health_pb2.HealthCheckRequest(service="")
            return health.Check(req, timeout=2).status == health_pb2.HealthCheckResponse.SERVING

        # baseline: process start to SERVING with nothing to load (interpreter, imports, DB)
        t0 = time.perf_counter()
        proc = _start_service(tmp, port, pg_url, rd_url, prefix + "empty")
        _wait(serving, "empty service up")
        out["start_empty_s"] = round(time.perf_counter() - t0, 3)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        sub = argparse.Namespace(**vars(args))
        sub.entries = args.service_entries
        sessions: list[tuple[list[int], list[str]]] = []
        r = redis.Redis.from_url(rd_url)
        pipe = r.pipeline(transaction=False)
        n_msgs = 0
        for iid, seq, lists in gen_batches(sub, random.Random(args.seed), sessions):
            evs = [events_pb2.KVEvent(kind=1, tier=1, block_hashes=h, tenant="t0") for h in lists]
            b = events_pb2.KVEventBatch(
                deployment="bench", instance_id=iid, epoch=1, seq=seq, events=evs, block_size=16
            )
            pipe.xadd(stream, encode_entry(b))  # type: ignore[arg-type]
            n_msgs += 1
            if n_msgs % 1000 == 0:
                pipe.execute()
        pipe.execute()
        last_id = r.xrevrange(stream, count=1)[0][0].decode()
        lreq = kvmeta_pb2.ListIndexedInstancesRequest(deployment="bench")

        def indexed() -> int:
            return sum(i.blocks for i in stub.ListIndexedInstances(lreq, timeout=10).instances)

        t0 = time.perf_counter()
        proc = _start_service(tmp, port, pg_url, rd_url, prefix)
        _wait(serving, "service up")
        _wait(lambda: indexed() >= args.service_entries, "stream ingested")
        ingest_s = time.perf_counter() - t0
        plain = pg_url.replace("postgresql+psycopg://", "postgresql://", 1)

        def checkpointed() -> bool:
            with psycopg.connect(plain) as conn:
                row = conn.execute(
                    "SELECT stream_id FROM kvmeta.index_checkpoints WHERE deployment = 'bench' "
                    "ORDER BY id DESC LIMIT 1"
                ).fetchone()
            return row is not None and row[0] == last_id

        _wait(checkpointed, "checkpoint")
        entries = indexed()
        out["entries"] = entries
        out["stream_messages"] = n_msgs
        out["cold_start_from_stream_s"] = round(ingest_s, 3)
        # MatchPrefix through gRPC (client in this process, server in its own)
        rng = random.Random(args.seed + 1)
        lat: list[float] = []
        for _ in range(args.grpc_queries):
            hashes, _h = sessions[rng.randrange(len(sessions))]
            cut = rng.randrange(1, len(hashes) + 1)
            prompt = hashes[:cut] + [rng.getrandbits(64) | 1 for _ in range(len(hashes) - cut)]
            req = kvmeta_pb2.MatchPrefixRequest(
                deployment="bench", tenant="t0", block_hashes=prompt
            )
            q0 = time.perf_counter()
            stub.MatchPrefix(req, timeout=10)
            lat.append((time.perf_counter() - q0) * 1000)
        out["grpc_match_prefix"] = {
            "queries": len(lat),
            "p50_ms": round(_pct(lat, 50), 3),
            "p99_ms": round(_pct(lat, 99), 3),
        }
        # IngestEvents (client streaming; each batch is also appended to the Redis stream)
        ing_batches = [
            events_pb2.KVEventBatch(
                deployment="bench-grpc",
                instance_id=f"g{k % 50}",
                epoch=1,
                seq=k // 50 + 1,
                events=[
                    events_pb2.KVEvent(
                        kind=1, tier=1, block_hashes=[rng.getrandbits(64) | 1 for _ in range(16)]
                    )
                    for _ in range(8)
                ],
            )
            for k in range(args.grpc_ingest_batches)
        ]
        q0 = time.perf_counter()
        resp = stub.IngestEvents(iter(ing_batches), timeout=600)
        dt = time.perf_counter() - q0
        out["grpc_ingest"] = {
            "batches": resp.batches_applied,
            "block_events_per_s": round(resp.batches_applied * 128 / dt),
        }
        # object master through gRPC, write-through to Postgres on every mutation
        out["grpc_objects"] = _grpc_object_ops(stub, args.grpc_objects)
        # kill -9, then time until SERVING again (checkpoint load + stream replay)
        for mode in ("checkpoint_plus_replay", "replay_only"):
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            if mode == "replay_only":
                with psycopg.connect(plain, autocommit=True) as conn:
                    conn.execute("DELETE FROM kvmeta.index_checkpoints")
            t0 = time.perf_counter()
            proc = _start_service(tmp, port, pg_url, rd_url, prefix)
            _wait(serving, f"restart ({mode})")
            out[f"recovery_{mode}_s"] = round(time.perf_counter() - t0, 3)
            ready = [
                ln for ln in (tmp / "kvmeta.stderr").read_text().splitlines() if "index ready" in ln
            ]
            # the service's own measure: checkpoint load + stream replay, without process start
            out[f"index_rebuild_{mode}_s"] = float(ready[-1].split(" in ")[1].split("s ")[0])
            got = indexed()
            assert got == entries, (mode, got, entries)
        out["recovery_note"] = (
            "process start to gRPC SERVING (served only after the index is rebuilt), incl. "
            "interpreter start and imports"
        )
        channel.close()
        r.close()
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        for stop in reversed(stops):
            stop()
        if not os.environ.get("KVBENCH_KEEP"):
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"kept {tmp}", file=sys.stderr)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--entries", type=int, default=10_000_000)
    ap.add_argument("--instances", type=int, default=1000)
    ap.add_argument("--families", type=int, default=200)
    ap.add_argument("--shared-blocks", type=int, default=32)
    ap.add_argument("--session-blocks", type=int, default=128)
    ap.add_argument("--blocks-per-event", type=int, default=16)
    ap.add_argument("--events-per-batch", type=int, default=8)
    ap.add_argument("--queries", type=int, default=5000)
    ap.add_argument("--objects", type=int, default=50_000)
    ap.add_argument(
        "--memory-entries",
        type=int,
        default=0,
        help="entries for the tracemalloc build (default: same as --entries)",
    )
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument(
        "--service",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also measure through a real kvmeta process (Postgres + Redis)",
    )
    ap.add_argument("--service-entries", type=int, default=1_000_000)
    ap.add_argument(
        "--mooncake",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="compare object operations with mooncake_master (if installed)",
    )
    ap.add_argument("--grpc-queries", type=int, default=2000)
    ap.add_argument("--grpc-ingest-batches", type=int, default=2000)
    ap.add_argument("--grpc-objects", type=int, default=2000)
    ap.add_argument("--postgres-url", default=None, help="default: an embedded server")
    ap.add_argument("--redis-url", default=None, help="default: an embedded server")
    ap.add_argument("--gc-freeze", action=argparse.BooleanOptionalAction, default=True)
    args = ap.parse_args()
    out: dict[str, object] = {"python": sys.version.split()[0], "cpus": os.cpu_count()}
    proc = psutil.Process()

    # 1) memory with tracemalloc (a separate build: tracemalloc slows ingest)
    mem_args = argparse.Namespace(**vars(args))
    mem_args.entries = args.memory_entries or args.entries
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    idx, st = build_index(mem_args, random.Random(args.seed))
    del idx._bench_sessions  # type: ignore[attr-defined]  # workload, not index
    gc.collect()
    used = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    out["memory"] = {
        "entries": st["entries"],
        "distinct_blocks": st["distinct_blocks"],
        "tracemalloc_bytes": used,
        "bytes_per_entry": round(used / max(1, int(st["entries"])), 1),  # type: ignore[call-overload]
    }
    del idx
    gc.collect()

    # 2) ingest rate + RSS, then match latency and snapshot on the same index
    rss0 = proc.memory_info().rss
    idx, st = build_index(args, random.Random(args.seed))
    rss1 = proc.memory_info().rss
    out["ingest"] = {
        "block_events": st["block_events"],
        "seconds": st["ingest_seconds"],
        "block_events_per_s": st["ingest_block_events_per_s"],
        "blocks_per_event": args.blocks_per_event,
        "events_per_batch": args.events_per_batch,
    }
    out["index"] = {
        "instances": args.instances,
        "entries": st["entries"],
        "rss_delta_bytes_incl_workload": rss1 - rss0,
    }
    if args.gc_freeze:
        gc.collect()
        gc.freeze()  # what the service does after loading: long-lived index out of GC scans
    out["match_prefix"] = bench_match(idx, args, random.Random(args.seed + 1))
    out["snapshot"] = bench_snapshot(idx)
    del idx
    gc.collect()
    out["object_master"] = bench_objects(args.objects)
    if args.service:
        out["service"] = bench_service(args)
    if args.mooncake:
        out["vs_mooncake"] = bench_vs_mooncake(args.grpc_objects)
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
