"""The data plane's pure bookkeeping (block bytes, contents, slots) and the wrapper's
completion, error and timeout handling over a fake native engine (the real one is exercised
in tests/integration/test_dataplane_native.py)."""

from __future__ import annotations

import asyncio
import heapq
import sys
import threading
from typing import Any

import pytest

from services.common.dataplane.blocks import SlotPool, block_bytes, block_content, mismatched
from services.common.dataplane.settings import DataPlaneSettings
from services.common.dataplane.transfer import (
    Arena,
    DataPlane,
    DataPlaneError,
    DataPlaneUnavailable,
    TransferError,
    TransferTimeout,
)
from tests.helpers.dataplane import FakeNative


@pytest.mark.parametrize(
    ("per_token", "block", "scale", "want"),
    [(131072, 64, 256, 32768), (131072, 64, 1, 8 << 20), (100, 1, 1000, 1)],
    ids=["llama8b-scaled", "unscaled", "at-least-one-byte"],
)
def test_block_bytes(per_token: int, block: int, scale: int, want: int) -> None:
    assert block_bytes(per_token, block, scale) == want


def test_block_content_is_deterministic_and_distinct() -> None:
    a = block_content(12345, 4096)
    assert a == block_content(12345, 4096) and len(a) == 4096
    assert block_content(12346, 4096) != a
    assert block_content(-1, 64) == block_content(2**64 - 1, 64)  # signed and unsigned agree
    assert block_content(12345, 100) == a[:100]  # a prefix of the same expansion


def test_mismatched_names_the_bad_blocks() -> None:
    hashes = [1, 2, 3]
    good = [block_content(h, 256) for h in hashes]
    assert mismatched(hashes, good) == []
    swapped = [good[1], good[0], good[2]]
    stale = [good[0], good[1], b"\0" * 256]
    assert mismatched(hashes, swapped) == [0, 1]
    assert mismatched(hashes, stale) == [2]


def test_slot_pool_hands_out_lowest_first_and_refuses_double_give() -> None:
    pool = SlotPool(4)
    assert pool.take(3) == [0, 1, 2] and pool.free == 1
    assert pool.take(2) is None and pool.free == 1  # nothing taken
    pool.give([1])
    assert pool.take(2) == [1, 3]
    with pytest.raises(ValueError, match="not taken"):
        pool.give([1, 1])
    with pytest.raises(ValueError, match="not taken"):
        pool.give([5])
    with pytest.raises(ValueError, match="not taken"):
        pool.give([-1])  # not the last slot by its negative index
    pool.give([2, 0])
    with pytest.raises(ValueError, match="not taken"):
        pool.give([1, 0])  # 0 is free already: 1 is not given back either
    assert pool.free == 2
    assert pool.take(3) is None and pool.take(2) == [0, 2] and pool.free == 0


def test_arena_reads_back_what_was_written_and_bounds_checks() -> None:
    arena = Arena(1 << 16)
    try:
        arena.write(100, b"abc")
        assert arena.read(99, 5) == b"\0abc\0" and arena.base > 0
        with pytest.raises(ValueError, match="outside"):
            arena.write((1 << 16) - 1, b"xy")
    finally:
        arena.close()


def _plane(native: type[Any], timeout_s: float = 5.0) -> DataPlane:
    return DataPlane(DataPlaneSettings("127.0.0.1:1", transfer_timeout_s=timeout_s), native=native)


async def test_read_copies_and_counts() -> None:
    dp = _plane(FakeNative)
    await dp.start()
    a, b = Arena(4096), Arena(4096)
    try:
        b.write(0, b"kv-bytes")
        done = await dp.read("peer:1", [a.base + 10], [b.base], [8])
        assert a.read(10, 8) == b"kv-bytes" and done.nbytes == 8
        assert (dp.transfers, dp.failures, dp.bytes_moved) == (1, 0, 8)
    finally:
        await dp.close()
        a.close()
        b.close()


async def test_non_zero_rc_is_a_transfer_error() -> None:
    native = type("Failing", (FakeNative,), {"rc": -1})
    dp = _plane(native)
    await dp.start()
    try:
        with pytest.raises(TransferError, match="returned -1"):
            await dp.read("peer:1", [1], [2], [3])
        assert dp.failures == 1
    finally:
        await dp.close()


async def test_timeout_returns_while_the_native_call_still_runs() -> None:
    gate = threading.Event()
    native = type("Stuck", (FakeNative,), {"gate": gate})
    dp = _plane(native, timeout_s=0.05)
    await dp.start()
    a, b = Arena(64), Arena(64)
    try:
        b.write(0, b"late")
        with pytest.raises(TransferTimeout) as err:
            await dp.read("peer:1", [a.base], [b.base], [4])
        assert not err.value.pending.done()  # the destination may still be written
        gate.set()
        assert await asyncio.wait_for(err.value.pending, 10) == 0
        assert a.read(0, 4) == b"late" and dp.failures == 1
    finally:
        await dp.close()
        a.close()
        b.close()


async def test_start_refused_names_the_endpoint() -> None:
    native = type("Refusing", (FakeNative,), {"init_rc": -1})
    dp = _plane(native)
    with pytest.raises(DataPlaneError, match=r"initialize.*returned -1"):
        await dp.start()
    await dp.close()


@pytest.mark.parametrize(
    "kw",
    [{"protocol": "udp"}, {"transfer_timeout_s": 0}],
    ids=["bad-protocol", "zero-timeout"],
)
def test_settings_refuse_bad_values(kw: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        DataPlaneSettings("127.0.0.1:1", **kw)


def test_missing_native_library_names_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "mooncake.engine", None)  # import fails as without the wheel
    with pytest.raises(DataPlaneUnavailable) as err:
        DataPlane(DataPlaneSettings("127.0.0.1:1"))
    for name in ("mooncake-transfer-engine-non-cuda", "libibverbs1", "libnuma1"):
        assert name in str(err.value)


@pytest.mark.parametrize(
    "ops",  # a number: take that many; a list: give those back
    [
        pytest.param([3, [1], 2, 1], id="reuse-then-fresh"),
        pytest.param([4, [3, 0], 1, 2], id="gaps"),
        pytest.param([8, 1, [5], 1], id="full"),
        pytest.param([0, 5, [4, 2], 3], id="more-than-freed"),
    ],
)
def test_slot_pool_takes_the_smallest_free_slots(ops: list[int | list[int]]) -> None:
    """The same slots as one heap of every free slot (the pool builds it lazily)."""
    pool, ref = SlotPool(8), list(range(8))
    for op in ops:
        if isinstance(op, list):
            pool.give(op)
            for s in op:
                heapq.heappush(ref, s)
            continue
        want = [heapq.heappop(ref) for _ in range(op)] if op <= len(ref) else None
        assert pool.take(op) == want
        assert pool.free == len(ref)
