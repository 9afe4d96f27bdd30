"""KV blocks as bytes (pure, no I/O): their deterministic contents, their size, and the
slots of a registered arena they live in.

Contents. A block's bytes are a keyed expansion of its chained hash: SHAKE-128 of a fixed
key and the hash (8 bytes, two's complement, little-endian), read out to the block's length.
Any receiver that knows the hash (it hashed the same prompt) recomputes the expected bytes
and compares: a block shifted, truncated, swapped with another block or left stale fails.

Size. ``block_bytes(kv_bytes_per_token, block_size, scale)`` = the profile's KV bytes per
token times the tokens per block, divided by ``scale`` (at least 1 byte): the real KV of a
Llama-3.1-8B block of 64 tokens is 8 MiB, so an engine holding a GPU's worth of blocks would
need ~100 GiB; scale 256 makes it 32 KiB a block and ~400 MiB an engine.

Slots. :class:`SlotPool` hands out fixed-size slots of one arena (lowest free first, so a
lightly used arena touches few pages). ``addr(slot) = base + slot * block_bytes``.
"""

from __future__ import annotations

import hashlib
import heapq
from collections import deque
from collections.abc import Sequence
from itertools import repeat

__all__ = ["SlotPool", "block_bytes", "block_content", "block_key", "mismatched"]

_KEY = b"tideserve-kv-block-v1"


def block_bytes(kv_bytes_per_token: int, block_size: int, scale: int) -> int:
    """Bytes of one block of ``block_size`` tokens, scaled down by ``scale`` (>= 1 byte)."""
    if kv_bytes_per_token <= 0 or block_size <= 0 or scale <= 0:
        raise ValueError("kv_bytes_per_token, block_size and scale must be positive")
    return max(1, kv_bytes_per_token * block_size // scale)


def block_content(block_hash: int, nbytes: int) -> bytes:
    """The ``nbytes`` bytes of the block whose chained hash is ``block_hash``."""
    h = hashlib.shake_128(_KEY)
    h.update((block_hash & 0xFFFF_FFFF_FFFF_FFFF).to_bytes(8, "little"))
    return h.digest(nbytes)


def mismatched(hashes: Sequence[int], data: Sequence[bytes]) -> list[int]:
    """Indexes ``i`` where ``data[i]`` is not the content of ``hashes[i]`` (empty = all good)."""
    if len(hashes) != len(data):
        raise ValueError(f"{len(hashes)} hashes but {len(data)} blocks")
    return [
        i
        for i, (h, d) in enumerate(zip(hashes, data, strict=True))
        if d != block_content(h, len(d))
    ]


def block_key(block_hash: int) -> str:
    """A block's object key in kvmeta's object master (the KV-cache tier)."""
    return f"kv-{block_hash & 0xFFFF_FFFF_FFFF_FFFF:016x}"


class SlotPool:
    """Free slots ``0 .. capacity-1`` of an arena. Not thread-safe (the event loop owns it)."""

    def __init__(self, capacity: int) -> None:
        if capacity <= 0:
            raise ValueError("capacity must be positive")
        self.capacity = capacity
        # The free slots are the heap ``_free`` (given back, all below ``_next``) and the
        # never-taken ``_next .. capacity-1``: the same smallest-first order as one heap of
        # them all, without building a list of every slot up front (a simulated fleet has
        # a thousand arenas of 16k slots). The heap's layout is free: the slots are distinct,
        # so any heap of them gives them up in the same order.
        self._free: list[int] = []
        self._next = 0
        # 1 per slot taken: a byte per slot, not a set entry (a simulated fleet holds a
        # thousand pools, and their sets' scattered entries cost a cache miss per slot)
        self._taken = bytearray(capacity)

    @property
    def free(self) -> int:
        return len(self._free) + self.capacity - self._next

    def take(self, n: int) -> list[int] | None:
        """``n`` slots, or None (nothing taken) when fewer are free."""
        if n < 0:
            raise ValueError("n must be >= 0")
        if n > self.free:
            return None
        free = self._free
        k = min(n, len(free))  # the given-back ones are all below the fresh ones
        if k == len(free):  # all of them (a full cache takes what it just evicted)
            out = sorted(free)
            free.clear()
        elif 8 * k >= len(free):  # a sorted list is a heap: the same smallest k, in C
            free.sort()
            out = free[:k]
            del free[:k]
        else:
            out = [heapq.heappop(free) for _ in range(k)]
        if k < n:
            out.extend(range(self._next, self._next + n - k))
            self._next += n - k
        deque(map(self._taken.__setitem__, out, repeat(1)), maxlen=0)
        return out

    def give(self, slots: Sequence[int]) -> None:
        """Return slots; a slot not taken (or given twice) is a ValueError, nothing changes."""
        taken, free, cap = self._taken, self._free, self.capacity
        if (
            (slots and (min(slots) < 0 or max(slots) >= cap))
            or not all(map(taken.__getitem__, slots))
            or len(set(slots)) != len(slots)
        ):
            bad = [s for s in slots if not (0 <= s < cap and taken[s])]
            raise ValueError(f"slots not taken: {bad or sorted(slots)}")
        deque(map(taken.__setitem__, slots, repeat(0)), maxlen=0)
        if len(slots) > 8 and 4 * len(slots) >= len(free):  # many (an eviction): in C
            free.extend(slots)
            heapq.heapify(free)
            return
        for s in slots:
            heapq.heappush(free, s)
