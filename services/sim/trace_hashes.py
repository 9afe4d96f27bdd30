"""Block hashes of a simulated prompt from its trace block ids (pure; numpy, no tokens).

A prompt of the simulator is ``lead`` fixed tokens (the chat role's), then the trace's blocks
of ``trace_block`` tokens each, named by their hash ids (the last one possibly cut short),
each block's tokens fixed by its id. So the tokens of a prompt's first ``j + 1`` blocks of
``block_size`` are fixed by ``j`` and the ids of the trace blocks those tokens reach, and
block ``j``'s hash here is a mix of ``j`` with a rolling hash of those ids. Two prompts share
their first ``k`` block hashes exactly when they share the tokens of their first ``k``
blocks (up to 64-bit collisions): the equality of the real chained hashes of their tokens
(:func:`~services.common.tokens.block_hashes`), which the simulated caches and routers key
on, at the cost of a few vector operations per prompt instead of a hash per block.

The values differ from the real ones; 64-bit and never 0 like them, and deterministic (integer
arithmetic modulo 2^64).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["trace_block_hashes"]

_U64 = np.uint64
_P = 0x100000001B3  # the rolling hash's base (odd, so invertible modulo 2^64)
_P_INV = pow(_P, -1, 1 << 64)
_ROLE = _U64(0x726F6C65)  # what a block of role tokens only reaches instead of an id
_POSITION = _U64(0x9E3779B97F4A7C15)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, elementwise (wrapping uint64 arithmetic)."""
    x = x ^ (x >> _U64(30))
    x *= _U64(0xBF58476D1CE4E5B9)
    x ^= x >> _U64(27)
    x *= _U64(0x94D049BB133111EB)
    x ^= x >> _U64(31)
    return x


class _Tables:
    """Powers of the base and, per prompt layout, each block's reach, grown on demand."""

    def __init__(self) -> None:
        self.powers = np.ones(0, dtype=_U64)
        self.inverses = np.ones(0, dtype=_U64)
        # (lead, trace_block, block_size) -> per block j: 1 + the last trace block its
        # tokens reach (0: role tokens only), and j's position term
        self.layouts: dict[tuple[int, int, int], tuple[np.ndarray, np.ndarray]] = {}

    def bases(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        if len(self.powers) < k:
            n = max(k, 2 * len(self.powers), 64)
            p, q = 1, 1
            pw, inv = [], []
            for _ in range(n):
                pw.append(p)
                inv.append(q)
                p, q = p * _P % (1 << 64), q * _P_INV % (1 << 64)
            self.powers = np.array(pw, dtype=_U64)
            self.inverses = np.array(inv, dtype=_U64)
        return self.powers[:k], self.inverses[:k]

    def layout(self, n: int, lead: int, trace_block: int, block_size: int) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
        key = (lead, trace_block, block_size)
        have = self.layouts.get(key)
        if have is None or len(have[0]) < n:
            m = max(n, 2 * len(have[0]) if have else 0, 256)
            j = np.arange(m, dtype=np.int64)
            last = j * block_size + (block_size - 1 - lead)  # the block's last trace token
            reach = np.maximum(last // trace_block, -1) + 1
            position = _mix((j.astype(_U64) + _U64(1)) * _POSITION)
            have = (reach, position)
            self.layouts[key] = have
        return have[0][:n], have[1][:n]


_TABLES = _Tables()


def trace_block_hashes(
    ids: Sequence[int], tokens: int, lead: int, trace_block: int, block_size: int
) -> tuple[int, ...]:
    """Stand-ins for the block hashes of a prompt of ``tokens`` tokens: ``lead`` fixed
    tokens, then the trace blocks ``ids`` (see the module doc); one per full block."""
    n = tokens // block_size
    if n <= 0:
        return ()
    reach, position = _TABLES.layout(n, lead, trace_block, block_size)
    k = int(reach[-1])  # trace blocks the prompt's full blocks reach
    prefix = np.empty(k + 1, dtype=_U64)
    prefix[0] = _ROLE
    if k:
        pw, inv = _TABLES.bases(k)
        terms = _mix(np.array(ids[:k], dtype=_U64) + _U64(1))
        terms *= inv
        prefix[1:] = np.cumsum(terms, dtype=_U64)
        prefix[1:] *= pw  # prefix[i + 1] = sum of terms[t] * P^(i - t), t <= i
    h = _mix(prefix[reach] ^ position)
    h[h == 0] = 1
    return tuple(h.tolist())
