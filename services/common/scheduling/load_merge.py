"""Which load figures an endpoint view uses (pure: no I/O, time is a parameter).

Two sources report an engine's load:

- ``stream``: the engine's own ``LoadSnapshot`` on ``{prefix}:load:{deployment}`` (every
  ~250 ms; running, waiting, KV usage, tokens in flight, pending prefill tokens,
  prefill/decode throughput), read by :mod:`services.scheduler.feeds.load_stream`;
- ``scrape``: the gateway's own ``GET /metrics`` poll (running, waiting, KV usage only).

Rule: a stream snapshot wins while it is fresh (received at most ``stream_stale_s`` ago);
otherwise a fresh scrape (at most ``scrape_stale_s`` old); otherwise nothing is known and
the view trusts only the gateway's own reservations. Scraping is only needed for endpoints
whose stream is not fresh (:func:`needs_scrape`). Snapshots are ordered by
``(epoch, ts_ms)``: an older or repeated one is ignored (:func:`newer`).

A stream snapshot counts work the gateway may since have seen end. What this gateway
dispatched before the snapshot arrived and has seen finish after it (:class:`Gone`:
requests released, prefill tokens whose first token came back) is taken off it
(:func:`discount`), so a conversation's next turn is not pushed off the instance holding
its prefix by the previous turn's pending prefill, still in a snapshot up to a reporting
interval old. Scrapes are left as reported (taking ended requests off their running counts
cost goodput in routing_sim, benchmarks/README.md), but they carry no pending prefill, so a
cost that prices the prefill queue saw only this gateway's own picks (its reservations).
:func:`foreign_prefill` estimates the rest: each waiting request the engine reports that
those picks do not account for (another gateway's, or sent around the gateway) at the mean
prefill of this gateway's picks.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from services.common.engine_load import LoadReport

__all__ = [
    "Gone",
    "LoadReport",
    "Sample",
    "Source",
    "discount",
    "foreign_prefill",
    "merge_load",
    "needs_scrape",
    "newer",
]

Source = Literal["stream", "scrape", "none"]


EMPTY = LoadReport()


@dataclass(frozen=True, slots=True)
class Sample:
    """A load report and when the gateway received it (its own clock, seconds)."""

    load: LoadReport
    at: float


@dataclass(slots=True)
class Gone:
    """Work counted in a report that this gateway has since seen end: its requests
    (released) and prefill tokens (first token back) dispatched before the report arrived.
    Reset with every new report of that source."""

    requests: int = 0
    prefill_tokens: int = 0


def discount(load: LoadReport, gone: Gone) -> LoadReport:
    """``load`` without what is ``gone`` (never below zero): ended requests come off
    ``running`` first, then ``waiting``; prefilled tokens off the pending prefill tokens and
    the tokens in flight."""
    if not gone.requests and not gone.prefill_tokens:
        return load
    running = max(0, load.running - gone.requests)
    waiting = max(0, load.waiting - max(0, gone.requests - load.running))
    return replace(
        load,
        running=running,
        waiting=waiting,
        pending_prefill_tokens=max(0, load.pending_prefill_tokens - gone.prefill_tokens),
        tokens_in_flight=max(0, load.tokens_in_flight - gone.prefill_tokens),
    )


def _fresh(s: Sample | None, now: float, stale_s: float) -> bool:
    return s is not None and now - s.at <= stale_s


def merge_load(
    stream: Sample | None,
    scrape: Sample | None,
    now: float,
    *,
    stream_stale_s: float,
    scrape_stale_s: float,
) -> tuple[LoadReport, Source, float]:
    """``(load, source, valid_until)``: the figures to use at ``now``, where they came
    from, and the time after which the answer may change by the passage of time alone
    (``inf`` when only a new sample can change it)."""
    if stream is not None and _fresh(stream, now, stream_stale_s):
        return stream.load, "stream", stream.at + stream_stale_s
    if scrape is not None and _fresh(scrape, now, scrape_stale_s):
        return scrape.load, "scrape", scrape.at + scrape_stale_s
    return EMPTY, "none", float("inf")


def needs_scrape(stream: Sample | None, now: float, stream_stale_s: float) -> bool:
    """True when the endpoint has no fresh stream snapshot (scrape ``/metrics`` instead)."""
    return not _fresh(stream, now, stream_stale_s)


def newer(last: tuple[int, int] | None, epoch: int, ts_ms: int) -> bool:
    """True when a snapshot stamped ``(epoch, ts_ms)`` is newer than the last one applied
    (a restarted engine has a higher epoch; equal stamps are a repeat)."""
    return last is None or (epoch, ts_ms) > last


def foreign_prefill(load: LoadReport, *, own_waiting: int, tokens_per_request: float) -> int:
    """The prefill tokens a scrape's waiting requests hold beyond this gateway's own: each
    waiting request beyond ``own_waiting`` (this gateway's picks on the instance that had not
    answered when the scrape arrived, so the waiting ones among them are its own) at
    ``tokens_per_request``. 0 when the report carries a prefill queue (it is used instead)."""
    if load.pending_prefill_tokens:
        return 0
    foreign = max(0, load.waiting - max(0, own_waiting))
    return int(foreign * max(0.0, tokens_per_request))
