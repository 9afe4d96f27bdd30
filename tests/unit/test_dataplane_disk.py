"""The disk segment's index (pure), its byte formats, and its log files (a temporary
directory): overlap rules, restart reconciliation, WAL and snapshot codecs, replay of a
snapshot plus a log tail, a torn last record, a truncated file, an interrupted compaction."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from services.common.dataplane.disk_codec import (
    WAL_MAGIC,
    CorruptSnapshot,
    decode_snapshot,
    decode_wal,
    encode_record,
    encode_snapshot,
)
from services.common.dataplane.disk_index import DiskBlock, DiskIndex, Drop, Put, reconcile
from services.common.dataplane.disk_store import DiskLog, FileArena


def blk(key: str, offset: int, size: int = 100, tenant: str = "", crc: int = 7) -> DiskBlock:
    return DiskBlock(tenant, key, offset, size, crc)


# ------------------------------------------------------------------------- index (pure)


@pytest.mark.parametrize(
    ("held", "new", "gone", "after"),
    [
        ([blk("a", 0)], blk("b", 100), [], ["a", "b"]),
        ([blk("a", 0)], blk("b", 0), ["a"], ["b"]),
        ([blk("a", 0)], blk("b", 50), ["a"], ["b"]),
        ([blk("a", 100)], blk("b", 50), ["a"], ["b"]),
        ([blk("a", 0), blk("c", 100), blk("d", 200)], blk("b", 50, 200), ["a", "c", "d"], ["b"]),
        ([blk("a", 0)], blk("a", 300), ["a"], ["a"]),
        ([blk("a", 0)], blk("a", 100, tenant="t"), [], ["a", "a"]),
        ([blk("a", 0), blk("c", 200)], blk("b", 100), [], ["a", "b", "c"]),
    ],
    ids=[
        "adjacent",
        "same-range",
        "overlaps-tail",
        "overlaps-head",
        "spans-three",
        "same-key-moves",
        "same-key-other-tenant",
        "fills-a-gap",
    ],
)
def test_put_replaces_same_key_and_overlapping_blocks(
    held: list[DiskBlock], new: DiskBlock, gone: list[str], after: list[str]
) -> None:
    index = DiskIndex(held)
    assert [b.key for b in index.put(new)] == gone
    assert [b.key for b in index.blocks()] == after
    assert index.used() == sum(b.size for b in index.blocks())


@pytest.mark.parametrize(
    ("records", "after"),
    [
        ([Put(blk("a", 0)), Put(blk("b", 100)), Drop("", "a")], ["b"]),
        ([Put(blk("a", 0)), Drop("", "zz"), Put(blk("b", 0))], ["b"]),
        ([Put(blk("a", 0)), Drop("", "a"), Put(blk("a", 100))], ["a"]),
    ],
    ids=["drop", "drop-unknown-then-overlap", "drop-then-put-again"],
)
def test_replay_applies_records_in_order(records: list[Put | Drop], after: list[str]) -> None:
    index = DiskIndex()
    for r in records:
        index.apply(r)
    assert [b.key for b in index.blocks()] == after


def test_a_bad_range_is_refused() -> None:
    with pytest.raises(ValueError, match="bad block range"):
        DiskIndex().put(blk("a", 0, size=0))


@pytest.mark.parametrize(
    ("intact", "listed", "keep", "reput", "drop"),
    [
        ([True, True], [True, True], "ab", "", ""),
        ([True, True], [True, False], "a", "", "b"),
        ([True, True], [False, False], "", "ab", ""),
        ([False, True], [True, False], "", "b", "a"),
        ([False, True], [False, True], "b", "", "a"),
        ([False, False], [False, False], "", "", "ab"),
        ([], [], "", "", ""),
    ],
    ids=[
        "kvmeta-kept-all",
        "kvmeta-evicted-one",
        "kvmeta-forgot",
        "listed-but-corrupt-counts-for-nothing",
        "corrupt-dropped",
        "all-corrupt",
        "empty",
    ],
)
def test_reconcile(
    intact: list[bool], listed: list[bool], keep: str, reput: str, drop: str
) -> None:
    held = [blk(k, i * 100) for i, k in enumerate("ab"[: len(intact)])]
    got = reconcile(held, intact, listed)
    assert "".join(b.key for b in got.keep) == keep
    assert "".join(b.key for b in got.reput) == reput
    assert "".join(b.key for b in got.drop) == drop


# ------------------------------------------------------------------------ codec (pure)

RECORDS: list[Put | Drop] = [
    Put(blk("kv-00000000000000aa", 0, 4096, crc=0xDEADBEEF)),
    Drop("tenant-ü", "kv-1"),
    Put(blk("kv-2", 1 << 40, 1 << 33, tenant="t")),
]
WAL = WAL_MAGIC + b"".join(encode_record(r) for r in RECORDS)
LAST = len(encode_record(RECORDS[-1]))


@pytest.mark.parametrize(
    ("data", "n", "good", "torn"),
    [
        (WAL, 3, len(WAL), False),
        (WAL[:-1], 2, len(WAL) - LAST, True),
        (WAL[: len(WAL) - LAST + 5], 2, len(WAL) - LAST, True),
        (WAL[:-4] + b"\0\0\0\0", 2, len(WAL) - LAST, True),
        (WAL + b"\xff" * 3, 3, len(WAL), True),
        (WAL_MAGIC, 0, len(WAL_MAGIC), False),
        (WAL_MAGIC[:3], 0, 0, True),
        (b"", 0, 0, False),
    ],
    ids=[
        "whole",
        "last-record-short-by-one",
        "last-record-header-only",
        "last-record-bad-checksum",
        "garbage-after",
        "magic-only",
        "truncated-magic",
        "empty-file",
    ],
)
def test_decode_wal_stops_at_a_torn_record(data: bytes, n: int, good: int, torn: bool) -> None:
    got = decode_wal(data)
    assert got.records == RECORDS[:n]
    assert (got.good, got.torn) == (good, torn)


def test_decode_wal_refuses_another_file() -> None:
    with pytest.raises(ValueError, match="bad magic"):
        decode_wal(b"PGDMP\0\0\0\0\0")


def test_snapshot_round_trip() -> None:
    blocks = [blk("a", 0), blk("b", 100, tenant="t", crc=2**32 - 1)]
    assert decode_snapshot(encode_snapshot(9, blocks)) == (9, blocks)
    assert decode_snapshot(encode_snapshot(0, [])) == (0, [])


@pytest.mark.parametrize(
    "mangle",
    [
        lambda b: b[:-1],
        lambda b: b[:10],
        lambda b: b[:20] + bytes([b[20] ^ 1]) + b[21:],
        lambda b: b"X" + b[1:],
    ],
    ids=["truncated", "header-only", "bit-flip", "bad-magic"],
)
def test_a_damaged_snapshot_is_refused(mangle: object) -> None:
    data = encode_snapshot(3, [blk("a", 0), blk("b", 100)])
    with pytest.raises(CorruptSnapshot):
        decode_snapshot(mangle(data))  # type: ignore[operator]


# ---------------------------------------------------------------- log files (tmp dir)


def _keys(index: DiskIndex) -> list[str]:
    return [b.key for b in index.blocks()]


def test_replay_snapshot_plus_tail_and_torn_record(tmp_path: Path) -> None:
    wal, index, replay = DiskLog.open(tmp_path)
    assert (len(index), replay.wal_records) == (0, 0)
    wal.append([Put(blk("a", 0)), Put(blk("b", 100))])
    for r in (Put(blk("a", 0)), Put(blk("b", 100))):
        index.apply(r)
    wal.compact(index)  # snapshot: a, b
    wal.append([Drop("", "a"), Put(blk("c", 200))])  # the tail
    wal.close()
    path = tmp_path / f"wal-{wal.generation:012d}.log"
    with path.open("ab") as f:  # a crash in the middle of the next record
        torn = encode_record(Put(blk("d", 300)))[:-3]
        f.write(torn)
    wal, index, replay = DiskLog.open(tmp_path)
    assert _keys(index) == ["b", "c"]
    assert (replay.snapshot_blocks, replay.wal_records, replay.torn_bytes) == (2, 2, len(torn))
    assert [p.name for p in sorted(tmp_path.glob("wal-*"))] == [path.name]  # older log gone
    wal.append([Put(blk("e", 400))])  # appends go after the cut, not after the garbage
    wal.close()
    assert _keys(DiskLog.open(tmp_path)[1]) == ["b", "c", "e"]


def test_compaction_interrupted_after_the_new_log(tmp_path: Path) -> None:
    wal, index, _ = DiskLog.open(tmp_path)
    wal.append([Put(blk("a", 0))])
    wal.close()
    DiskLog._create_wal(tmp_path, 1)  # the switch happened; the snapshot was never written
    with (tmp_path / "wal-000000000001.log").open("ab") as f:
        f.write(encode_record(Put(blk("b", 100))))
    _, index, replay = DiskLog.open(tmp_path)
    assert _keys(index) == ["a", "b"] and replay.wal_records == 2


def test_a_log_cut_inside_its_magic_is_restarted(tmp_path: Path) -> None:
    (tmp_path / "wal-000000000000.log").write_bytes(WAL_MAGIC[:5])
    wal, index, replay = DiskLog.open(tmp_path)
    assert len(index) == 0 and replay.torn_bytes == 5
    wal.append([Put(blk("a", 0))])
    wal.close()
    assert _keys(DiskLog.open(tmp_path)[1]) == ["a"]


def test_file_arena_keeps_bytes_and_address(tmp_path: Path) -> None:
    size = 4 * os.sysconf("SC_PAGE_SIZE")
    arena = FileArena(tmp_path / "blocks.dat", size)
    base, stable = arena.base, arena.stable
    arena.write(5000, b"hello")
    arena.flush([(5000, 5), (0, 3), (4090, 20), (3 * size // 4, 1)])  # merged into two spans
    arena.close()
    again = FileArena(tmp_path / "blocks.dat", size)
    try:
        assert again.read(5000, 5) == b"hello"
        assert bytes(again.view(5001, 2)) == b"el"
        if stable:  # the derived address was free both times
            assert again.base == base
    finally:
        again.close()
