"""Per-tenant rate limits: the window decision (pure).

Rule: a sliding window of ``window_ms`` approximated by two fixed windows (the current one
and the one before, weighted by how much of it still overlaps the sliding window):
``estimate = previous x (1 - elapsed/window) + current``, where ``current`` already holds
this request (one request, ``cost`` tokens). The request passes when both the request
estimate is within ``rpm`` and the token estimate within ``tpm`` (per window; a limit of
None is no limit). A refusal says when the estimate will be back within the limit
(``retry_after_ms``: when the same request, retried with no other traffic, passes), and
the caller takes the refused request back out of the counters. A request whose cost alone is over ``tpm`` can never pass:
:class:`TooLarge` (a 400, not a 429 a client would retry forever).

Tokens per request are charged at admission as prompt tokens + ``max_tokens`` (the most it
may use; the completion's length is not known yet and nothing is refunded).

Leases (so the hot path needs no round trip per request): a replica reserves a
:class:`Lease` of ``fraction`` of each limit at once (:func:`lease_size`; decided like one
request of that size, ``requests`` = its size) and admits from it locally (:func:`spend`)
until it runs out or the window changes; then its unspent rest is given back to the window
it was taken in. Every admitted request was reserved beforehand, so leases never admit more
than the per-request rule; they may refuse early by what other replicas hold unspent (at
most ``fraction`` of a limit each). When a lease is refused, the request is decided alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = [
    "Allow",
    "Lease",
    "Limited",
    "TooLarge",
    "WindowCounts",
    "decide",
    "lease_size",
    "spend",
    "window_index",
]


@dataclass(frozen=True, slots=True)
class WindowCounts:
    """A tenant's counters after adding this request: requests and tokens in the previous
    and the current fixed window."""

    prev_requests: int
    cur_requests: int
    prev_tokens: int
    cur_tokens: int


@dataclass(frozen=True, slots=True)
class Allow:
    pass


@dataclass(frozen=True, slots=True)
class Limited:
    """Refused: ``what`` is ``requests`` or ``tokens``."""

    what: str
    limit: int
    retry_after_ms: int


@dataclass(frozen=True, slots=True)
class TooLarge:
    cost: int
    limit: int


def window_index(now_ms: int, window_ms: int) -> tuple[int, float]:
    """(index of the fixed window holding ``now_ms``, fraction of it elapsed)."""
    return now_ms // window_ms, (now_ms % window_ms) / window_ms


def _wait_ms(prev: int, cur: int, limit: int, unit: int, elapsed: float, window_ms: int) -> int:
    """Time until the same request (``unit``: 1 request, or its tokens), refused now and
    taken back, would pass with no other traffic."""
    if cur <= limit:
        # in this window (the retry adds back what was taken), once the previous window's
        # weight has decayed: prev x (1 - t) + cur <= limit
        weight = (limit - cur) / prev if prev else 1.0
        return _ms(1.0 - weight - elapsed, window_ms)
    # in the next one, where this window without the request weighs (1 - t) and the
    # retry counts in full: (cur - unit) x (1 - t) + unit <= limit
    return _ms(1.0 - elapsed + 1.0 - (limit - unit) / (cur - unit), window_ms)


def _ms(fraction: float, window_ms: int) -> int:
    """``fraction`` of a window in whole ms, at least 1 (float noise rounded away)."""
    return max(1, math.ceil(round(fraction * window_ms, 6)))


def _estimate(prev: int, cur: int, elapsed: float) -> float:
    return prev * (1.0 - elapsed) + cur


def decide(
    counts: WindowCounts,
    *,
    elapsed: float,
    window_ms: int,
    rpm: int | None,
    tpm: int | None,
    cost: int,
    requests: int = 1,
) -> Allow | Limited | TooLarge:
    """The decision for ``requests`` requests of ``cost`` tokens in all (one request, or a
    lease), already counted in ``counts`` (see the module rule)."""
    if tpm is not None and cost > tpm:
        return TooLarge(cost, tpm)
    c = counts
    if rpm is not None and _estimate(c.prev_requests, c.cur_requests, elapsed) > rpm:
        wait = _wait_ms(c.prev_requests, c.cur_requests, rpm, requests, elapsed, window_ms)
        return Limited("requests", rpm, wait)
    if tpm is not None and _estimate(c.prev_tokens, c.cur_tokens, elapsed) > tpm:
        wait = _wait_ms(c.prev_tokens, c.cur_tokens, tpm, cost, elapsed, window_ms)
        return Limited("tokens", tpm, wait)
    return Allow()


@dataclass(frozen=True, slots=True)
class Lease:
    """Budget a replica reserved in window ``index`` and has not spent yet."""

    index: int
    requests: int
    tokens: int


def lease_size(rpm: int | None, tpm: int | None, cost: int, fraction: float) -> tuple[int, int]:
    """(requests, tokens) to reserve at once: ``fraction`` of each limit, at least what this
    request needs (an unlimited dimension: as many as the limited one implies)."""
    r = max(1, int(rpm * fraction)) if rpm is not None else 0
    t = max(cost, int(tpm * fraction)) if tpm is not None else 0
    if rpm is None:
        r = max(1, t // max(1, cost))
    if tpm is None:
        t = cost * r
    return r, t


def spend(lease: Lease, rpm: int | None, tpm: int | None, cost: int) -> Lease | None:
    """``lease`` after admitting one request of ``cost`` tokens, or None when it cannot (a
    dimension without a limit is not checked)."""
    if (rpm is not None and lease.requests < 1) or (tpm is not None and lease.tokens < cost):
        return None
    return Lease(lease.index, lease.requests - 1, lease.tokens - cost)
