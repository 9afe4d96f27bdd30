"""What the simulator replays (pure apart from reading the trace file).

Traces are read by the bench's readers (:mod:`services.common.bench.traces`: Mooncake JSONL, which
is also the format of the agentic traces, whose sessions show as shared ``hash_ids`` and
whose think times are the gaps between a session's turns; and Azure CSV), so a trace the
bench replays live is the trace simulated here.

Prompts are the bench's (:class:`services.common.bench.prompts.PromptSynthesizer`, seed 0),
tokenized as the gateway and the simulator engine see a chat message: ``"user: " + prompt``.

A trace shorter than ``max_requests`` repeats: round ``r`` starts one mean inter-arrival gap
after round ``r - 1`` ended, and shifts every hash id by ``r x (largest id + 1)``, so a
repeated request shares no prefix with its original (fresh prefix ids) while keeping the
trace's own reuse within the round. Azure requests (no hash ids) get fresh indexes, hence
fresh words.
"""

from __future__ import annotations

import zlib
from array import array
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import overload

import numpy as np

from services.common.bench.prompts import PromptSynthesizer
from services.common.bench.traces import MOONCAKE_BLOCK_TOKENS, Trace, TraceRequest
from services.common.tokens import (
    FIRST_WORD_ID,
    TOKEN_BYTES,
    VOCAB_SIZE,
    payload_block_hashes,
    tokenize,
)
from services.sim.trace_hashes import trace_block_hashes

__all__ = ["Arrival", "PromptIds", "Prompts", "ShiftedIds", "arrivals", "repeated"]

Arrival = tuple[float, TraceRequest]
"""(arrival in ms of modelled time, the request)."""


def repeated(requests: Sequence[TraceRequest], n: int) -> Iterator[TraceRequest]:
    """The first ``n`` requests of ``requests`` repeated as often as needed (see module
    doc); ``index`` counts across rounds."""
    if not requests or n <= 0:
        return
    base = requests[0].arrival_s
    span = requests[-1].arrival_s - base
    gap = span / (len(requests) - 1) if len(requests) > 1 else 1.0
    period = span + gap
    top = max((max(r.hash_ids) for r in requests if r.hash_ids), default=-1) + 1
    for k in range(n):
        rnd, i = divmod(k, len(requests))
        r = requests[i]
        if rnd == 0 and r.index == k:
            yield r
            continue
        ids = r.hash_ids
        if ids is not None and rnd:
            ids = ShiftedIds(ids, rnd * top)
        yield replace(r, index=k, arrival_s=r.arrival_s + rnd * period, hash_ids=ids)


class ShiftedIds(Sequence[int]):
    """A repeated request's hash ids: its original's plus ``shift``, computed when read (a
    million replayed requests would otherwise hold some fifty million int objects). Equal
    to, and hashed as, the tuple of its ids."""

    __slots__ = ("base", "shift")

    def __init__(self, base: Sequence[int], shift: int) -> None:
        self.base, self.shift = base, shift

    def __len__(self) -> int:
        return len(self.base)

    def __iter__(self) -> Iterator[int]:
        return map(self.shift.__add__, self.base)

    @overload
    def __getitem__(self, i: int) -> int: ...
    @overload
    def __getitem__(self, i: slice) -> tuple[int, ...]: ...
    def __getitem__(self, i: int | slice) -> int | tuple[int, ...]:
        if isinstance(i, slice):
            return tuple(map(self.shift.__add__, self.base[i]))
        return self.base[i] + self.shift

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ShiftedIds | tuple):
            return tuple(self) == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return repr(tuple(self))


def arrivals(
    trace: Trace, max_requests: int | None, divisor: float, offset: int = 0
) -> list[Arrival]:
    """The requests to replay with their arrival times (ms from the first one): trace time
    divided by ``divisor`` (rate scale x speedup)."""
    reqs = trace.requests[offset:]
    n = len(reqs) if max_requests is None else max_requests
    out: list[Arrival] = []
    t0: float | None = None
    for r in repeated(reqs, n):
        if t0 is None:
            t0 = r.arrival_s
        out.append(((r.arrival_s - t0) * 1000.0 / divisor, r))
    return out


_PAYLOAD = np.dtype(f"=u{TOKEN_BYTES}")  # array("I")'s items: native order
_SPAN, _FIRST = np.uint32(VOCAB_SIZE - FIRST_WORD_ID), np.uint32(FIRST_WORD_ID)


class Prompts:
    """The bench's prompt for a trace request, tokenized as the gateway and engine see it.
    Blocks are memoized by hash id (a block's tokens are the same wherever it appears), the
    most recent ``memo_blocks`` of them."""

    def __init__(
        self, block_tokens: int = MOONCAKE_BLOCK_TOKENS, memo_blocks: int = 65_536
    ) -> None:
        self.synth = PromptSynthesizer(0, block_tokens, cache_blocks=0)
        self.role = tuple(tokenize("user:"))
        self._role_payload = array("I", self.role).tobytes()
        self.memo_blocks = max(1, memo_blocks)
        # per hash id: the block's token ids as hashed (their array("I") bytes)
        self._blocks: OrderedDict[int, bytes] = OrderedDict()
        # The synthesizer's words of a block are "s0.<id>.<i>" (hex). A word's token id is
        # crc32(prefix + suffix), and crc32 continued over L bytes is affine in the value it
        # continues from: crc32(suffix, c) = crc32(suffix, 0) ^ shift_L(c), where shift_L(c)
        # = crc32(L zero bytes, c) ^ crc32(L zero bytes, 0). So a block's ids are one
        # vector operation over the suffixes' own crc32s.
        suffixes = [f"{i:x}".encode("ascii") for i in range(block_tokens)]
        self._suffix_crc = np.array([zlib.crc32(x) for x in suffixes], dtype=np.uint32)
        lengths = sorted({len(x) for x in suffixes})
        # per suffix, the column of its length in a block's row of shifts
        self._suffix_col = np.array([lengths.index(len(x)) for x in suffixes], dtype=np.intp)
        self._zeros = [(bytes(n), zlib.crc32(bytes(n), 0)) for n in lengths]

    def block_tokens(self, h: int) -> tuple[int, ...]:
        """``tokenize(synth.block_text(h))`` without building the text."""
        return tuple(array("I", self._synthesize([h])[0]))

    def _synthesize(self, hs: Sequence[int]) -> list[bytes]:
        """The payload of each of ``hs`` (``array("I", block_tokens(h)).tobytes()``), in one
        vector operation for all."""
        seed = self.synth.seed
        zeros = self._zeros
        crc32 = zlib.crc32
        rows = []
        for h in hs:
            base = crc32(f"s{seed:x}.{h:x}.".encode("ascii"))
            rows.append([crc32(z, base) ^ crc0 for z, crc0 in zeros])
        shift = np.array(rows, dtype=np.uint32).reshape(len(hs), len(zeros))
        ids = shift[:, self._suffix_col]
        ids ^= self._suffix_crc
        np.remainder(ids, _SPAN, out=ids)  # uint32 throughout: no wider copies
        ids += _FIRST
        data = ids.astype(_PAYLOAD, copy=False).tobytes()
        size = len(data) // max(1, len(hs))
        return [data[i : i + size] for i in range(0, len(data), size)] if size else [b""] * len(hs)

    def tokens(self, r: TraceRequest) -> tuple[int, ...]:
        return tuple(self.prompt(r)[0])

    def prompt(self, r: TraceRequest) -> tuple[array[int], bytes]:
        """The prompt's token ids (an ``array("I")``: no int object per id) and its payload
        for :func:`~services.common.tokens.payload_block_hashes` (the array's bytes)."""
        bt = self.synth.block_tokens
        used = list(r.hash_ids or ())[: -(-r.input_length // bt)]
        parts = [self._role_payload, *self._payloads(used)]
        covered = max(0, min(r.input_length, len(used) * bt))
        payload = b"".join(parts)[: (len(self.role) + covered) * TOKEN_BYTES]
        ids: array[int] = array("I")
        ids.frombytes(payload)
        remaining = r.input_length - len(used) * bt
        if remaining > 0:  # traces without hash ids: unique words
            ids.extend(tokenize(self.synth.prompt(r))[r.input_length - remaining :])
            payload = ids.tobytes()
        return ids, payload

    def _payloads(self, hs: Sequence[int]) -> list[bytes]:
        """The payload of each trace block of ``hs``: from the memo, the rest made at once."""
        memo = self._blocks
        fresh = [h for h in dict.fromkeys(hs) if h not in memo]
        if not fresh:
            return [memo[h] for h in hs]
        made = dict(zip(fresh, self._synthesize(fresh), strict=True))
        out = [made.get(h) or memo[h] for h in hs]
        for h, payload in made.items():
            memo[h] = payload
            if len(memo) > self.memo_blocks:
                memo.popitem(last=False)
        return out

    def request(self, r: TraceRequest, block_size: int) -> tuple[Sequence[int], tuple[int, ...]]:
        """The prompt as the simulated engines and gateways read it: its ids as a
        :class:`PromptIds` (its length; the ids made only when read) and its block hashes.

        For a request with hash ids the hashes are :func:`trace_block_hashes`, which have
        the equality of the prompt's real block hashes (two prompts share their first ``k``
        block hashes exactly when they share the tokens of their first ``k`` blocks) without
        making or hashing a token: a block's tokens are fixed by the trace blocks it covers
        and its position. Without hash ids (Azure: unique words) they are the real ones."""
        bt = self.synth.block_tokens
        n = r.input_length
        ids = list(r.hash_ids or ())[: -(-n // bt)]
        if n > len(ids) * bt or n < 0:  # traces without hash ids: unique words
            toks, payload = self.prompt(r)
            return toks, tuple(payload_block_hashes(payload, block_size))
        role = len(self.role)
        return PromptIds(role + n, self, r), trace_block_hashes(ids, role + n, role, bt, block_size)


class PromptIds(Sequence[int]):
    """A prompt's token ids by their number, made (:meth:`Prompts.prompt`) only when read:
    the simulator's engines and gateways read a prompt's length, and a million prompts of
    some 10k ids each would otherwise be made and held."""

    __slots__ = ("_ids", "_n", "_prompts", "_request")

    def __init__(self, n: int, prompts: Prompts, request: TraceRequest) -> None:
        self._n, self._prompts, self._request = n, prompts, request
        self._ids: array[int] | None = None

    def _made(self) -> array[int]:
        if self._ids is None:
            self._ids = self._prompts.prompt(self._request)[0]
        return self._ids

    def __len__(self) -> int:
        return self._n

    def __iter__(self) -> Iterator[int]:
        return iter(self._made())

    @overload
    def __getitem__(self, i: int) -> int: ...
    @overload
    def __getitem__(self, i: slice) -> array[int]: ...
    def __getitem__(self, i: int | slice) -> int | array[int]:
        return self._made()[i]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PromptIds):
            other = other._made()
        if isinstance(other, array | tuple | list):
            return list(self._made()) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]
