"""In-process kvmeta core benchmarks of `kvmeta_bench.py`: the synthetic ingest workload, the
prefix index (ingest, MatchPrefix, snapshot/restore) and the object master."""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

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
