"""A small slice of an agentic trace, scaled to a small model's context (pure).

The WEKA agentic trace (Mooncake JSONL, 512-token ``hash_ids``) carries no session id, but
its sessions share nothing with each other and every turn of a session starts with the
session's first block, so a session is the requests sharing a first hash id. Sessions are
numbered by the arrival of their first request.

A slice is sessions ``[a, b)`` of that order; ``requests`` takes the first N of their
requests by arrival. Scaling keeps the prefix structure and the relative lengths: each
512-token trace block becomes ``block_tokens`` tokens, with ``block_tokens`` the largest
whole number that fits the slice's longest prompt in ``max_prompt_tokens``, and a request's
input length scales by the same factor (rounded up, never past its blocks).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from services.common.bench.traces import MOONCAKE_BLOCK_TOKENS, Trace, TraceRequest

__all__ = [
    "SlicedRequest", "block_tokens_for", "p95", "parse_slice", "scale", "sessions", "slice_trace",
    "take",
]  # fmt: skip


@dataclass(frozen=True, slots=True)
class SlicedRequest:
    """One request of the slice: its session (slice-relative), turn in the session and the
    trace request with ``input_length`` scaled (``hash_ids`` unchanged)."""

    session: int
    turn: int
    request: TraceRequest
    output_tokens: int


def parse_slice(text: str) -> tuple[int, int]:
    """``"A:B"`` (sessions A..B-1) or ``"B"`` (= ``0:B``); ValueError when empty or bad."""
    a_text, sep, b_text = text.partition(":")
    try:
        a, b = (int(a_text or 0), int(b_text)) if sep else (0, int(a_text))
    except ValueError:
        raise ValueError(f"slice {text!r}: want A:B (session numbers)") from None
    if a < 0 or b <= a:
        raise ValueError(f"slice {text!r}: want 0 <= A < B")
    return a, b


def sessions(requests: Sequence[TraceRequest]) -> list[list[TraceRequest]]:
    """Requests grouped by first hash id, sessions by their first arrival, turns by arrival."""
    by_first: dict[int, list[TraceRequest]] = {}
    for r in sorted(requests, key=lambda r: (r.arrival_s, r.index)):
        if not r.hash_ids:
            raise ValueError(f"request {r.index} has no hash_ids: not an agentic trace")
        by_first.setdefault(r.hash_ids[0], []).append(r)
    return list(by_first.values())


def take(
    requests: Sequence[TraceRequest], slice_: tuple[int, int], n: int
) -> list[tuple[int, int, TraceRequest]]:
    """``(session, turn, request)`` of the first ``n`` requests by arrival of the sessions in
    ``slice_`` (session numbers relative to the slice's first)."""
    a, b = slice_
    groups = sessions(requests)
    if b > len(groups):
        raise ValueError(f"slice {a}:{b} but the trace has {len(groups)} sessions")
    tagged = [(s - a, t, r) for s in range(a, b) for t, r in enumerate(groups[s])]
    tagged.sort(key=lambda x: (x[2].arrival_s, x[2].index))
    return tagged[:n]


def block_tokens_for(
    picked: Sequence[TraceRequest], max_prompt_tokens: int, trace_block: int = MOONCAKE_BLOCK_TOKENS
) -> int:
    """Tokens per trace block so that the longest prompt fits ``max_prompt_tokens``."""
    longest = max((len(r.hash_ids or ()) for r in picked), default=0)
    if longest == 0:
        raise ValueError("nothing to scale")
    bt = min(trace_block, max_prompt_tokens // longest)
    if bt < 1:
        raise ValueError(
            f"{max_prompt_tokens} tokens cannot hold a prompt of {longest} blocks: pick a "
            "smaller slice or a larger context"
        )
    return bt


def scale(
    picked: Sequence[tuple[int, int, TraceRequest]],
    block_tokens: int,
    max_output_tokens: int,
    trace_block: int = MOONCAKE_BLOCK_TOKENS,
) -> list[SlicedRequest]:
    """Each request with ``input_length`` scaled by ``block_tokens / trace_block`` (at least 1,
    at most its blocks' tokens) and output capped at ``max_output_tokens`` (at least 1)."""
    out = []
    for session, turn, r in picked:
        blocks = len(r.hash_ids or ())
        n = min(
            blocks * block_tokens, max(1, math.ceil(r.input_length * block_tokens / trace_block))
        )
        out.append(
            SlicedRequest(
                session=session,
                turn=turn,
                request=replace(r, input_length=n),
                output_tokens=max(1, min(r.output_length, max_output_tokens)),
            )
        )
    return out


def slice_trace(trace: Trace, a: int, b: int, n: int) -> Trace:
    """Sessions ``[a, b)`` of ``trace``, their first ``n`` requests by arrival, renumbered
    from 0 with arrivals relative to the first (lengths not scaled)."""
    groups = sessions(trace.requests)[a:b]
    picked = sorted((r for g in groups for r in g), key=lambda r: (r.arrival_s, r.index))[:n]
    t0 = picked[0].arrival_s
    reqs = tuple(replace(r, index=i, arrival_s=r.arrival_s - t0) for i, r in enumerate(picked))
    return Trace(trace.path, trace.format, reqs, trace.block_tokens)


def p95(xs: Sequence[float]) -> float:
    """The nearest-rank 95th percentile the agent-memory benchmarks report (0 when empty)."""
    s = sorted(xs)
    return s[min(len(s) - 1, int(0.95 * len(s)))] if s else 0.0
