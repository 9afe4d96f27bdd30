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
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psutil

from services.kvmeta.index import STORED, BlockEvent, PrefixIndex
from services.kvmeta.objects import ObjectMaster, ReplicaConfig, SegmentSpec


def _pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(p / 100 * len(s)))]


def build_index(
    args: argparse.Namespace, rng: random.Random
) -> tuple[PrefixIndex, dict[str, object]]:
    idx = PrefixIndex()
    inst_ids = [f"i{n:04d}" for n in range(args.instances)]
    seqs = dict.fromkeys(inst_ids, 0)
    families = [
        [rng.getrandbits(64) | 1 for _ in range(args.shared_blocks)] for _ in range(args.families)
    ]
    family_holders: dict[int, set[str]] = {f: set() for f in range(args.families)}
    sessions: list[tuple[list[int], list[str]]] = []
    tail_len = args.session_blocks - args.shared_blocks
    entries = 0
    block_events = 0
    apply_s = 0.0
    bpe = args.blocks_per_event
    pending: dict[str, list[BlockEvent]] = {i: [] for i in inst_ids}

    def flush(iid: str) -> None:
        nonlocal apply_s
        evs = pending[iid]
        if not evs:
            return
        seqs[iid] += 1
        t0 = time.perf_counter()
        idx.apply_batch("bench", iid, 1, seqs[iid], evs, 0.0)
        apply_s += time.perf_counter() - t0
        pending[iid] = []

    def store(iid: str, hashes: list[int]) -> None:
        nonlocal block_events
        for k in range(0, len(hashes), bpe):
            pending[iid].append(BlockEvent(STORED, hashes[k : k + bpe], 1, "t0"))
            block_events += len(hashes[k : k + bpe])
            if len(pending[iid]) >= args.events_per_batch:
                flush(iid)

    while entries < args.entries:
        fam = rng.randrange(args.families)
        r = rng.random()
        k = 1 if r < 0.8 else (2 if r < 0.95 else 4)
        holders = rng.sample(inst_ids, k)
        tail = [rng.getrandbits(64) | 1 for _ in range(tail_len)]
        for iid in holders:
            if iid not in family_holders[fam]:
                family_holders[fam].add(iid)
                store(iid, families[fam])
                entries += len(families[fam])
            store(iid, tail)
            entries += tail_len
        if len(sessions) < 20_000:
            sessions.append((families[fam] + tail, holders))
        elif rng.random() < 0.05:
            sessions[rng.randrange(len(sessions))] = (families[fam] + tail, holders)
    for iid in inst_ids:
        flush(iid)
    stats: dict[str, object] = {
        "entries": idx.entry_count(),
        "distinct_blocks": sum(
            len(d) for dep in idx._deps.values() for sp in dep.spaces.values() for d in sp.values()
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
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
