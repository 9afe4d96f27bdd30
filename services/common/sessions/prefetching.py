"""The retention controller's prefetch decisions for one tick (pure).

An idle session whose prefix was offloaded (its placement records blocks on a tier and none
on the GPU) should be back on the engine that will serve its next turn (its home; after a
migration, the re-homed instance) shortly before that turn arrives.

- :func:`due_prefetches`: which sessions to start prefetching now. For each idle session
  with a chain, offloaded, not tracked already, whose predicted return is still ahead and
  whose home engine has a tier: :func:`~services.common.sessions.prefetch.plan_prefetch`
  with the engine's performance profile (fetching the chain over the tier link versus
  recomputing it before one block of new tokens). It is due when fetching pays and its start
  time falls before the next tick (``now + tick_s``), so a tick's granularity does not make
  it late. A session already overdue is left on the tier: its prediction missed, and
  bringing it back now would only be offloaded again (the retention rule offloads overdue
  sessions first).
- :func:`settle`: what became of the prefetches started earlier, from the engines' reports
  and the sessions now. A job the engine reports ``done`` is *finished*; ``failed`` (or
  missing from a report of an engine that answered: it restarted) is *failed*, and stays
  tracked (not held) so that it is not started again for the same turn. When the
  session's next turn has arrived (its turn count grew, or it is active), the prefetch ends:
  *late* when it was not finished by then (as seen by this tick: a tick's granularity), else
  *used*. A session ended, forgotten, re-homed, or past its predicted return without a turn
  ends its prefetch too (*expired*). What is still tracked after settling is *held*: the
  controller keeps those sessions' blocks protected and out of the offload list until their
  turn arrives (:func:`~services.common.sessions.controller.plan_engines`' ``hold``).
- :func:`evicted_to_tier`: an idle session the retention rule kept on the GPU (unprotected,
  evictable cache) whose blocks its home engine evicted on demand is recorded on the tier
  when the tier holds them (the engine offloads on eviction, or wrote them through), so
  :func:`due_prefetches` covers it as it covers a session the controller offloaded itself.
  What is where comes from kvmeta's index (the engine's KV events: the leading blocks still
  on the home's GPU) and the tier's objects (their leading run); a session idle for less than
  ``min_idle_s`` is left alone (the index may not have seen its turn's blocks yet).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from services.common.kvindex.events import TIERS
from services.common.perfmodel import PerfProfile
from services.common.sessions.model import Phase, Session, SessionKey
from services.common.sessions.prefetch import (
    PrefetchPlan,
    TierLink,
    fetch_ms,
    plan_prefetch,
    recompute_ms,
)

__all__ = [
    "Due",
    "EngineLink",
    "Settled",
    "Tracked",
    "due_prefetches",
    "evicted_to_tier",
    "job_id",
    "may_be_evicted",
    "offloaded",
    "settle",
    "started",
]

GPU, CPU = TIERS[0], TIERS[1]


@dataclass(frozen=True, slots=True)
class EngineLink:
    """What the controller needs of an engine to weigh a prefetch: its performance profile,
    block size, and whether it has a tier to fetch from."""

    profile: PerfProfile
    block_size: int
    has_tier: bool = True


@dataclass(frozen=True, slots=True)
class Due:
    key: SessionKey
    instance: str
    job_id: str
    tenant: str
    hashes: tuple[int, ...]
    plan: PrefetchPlan


@dataclass(frozen=True, slots=True)
class Tracked:
    """A prefetch started for a session's next turn."""

    key: SessionKey
    instance: str
    job_id: str
    turns: int  # the session's turn count when it started: a larger one is its next turn
    started_at: float
    blocks: int
    done: bool = False
    failed: bool = False

    @property
    def held(self) -> bool:
        """Its blocks are kept (protected, not offloaded) until the turn arrives."""
        return not self.failed


@dataclass
class Settled:
    tracked: dict[SessionKey, Tracked] = field(default_factory=dict)  # still held
    finished: list[Tracked] = field(default_factory=list)  # done this tick
    failed: list[Tracked] = field(default_factory=list)
    late: list[Tracked] = field(default_factory=list)  # the turn came first
    used: list[Tracked] = field(default_factory=list)  # done before the turn came
    expired: list[Tracked] = field(default_factory=list)


def offloaded(s: Session) -> bool:
    """The session's placement records its prefix on a tier and none of it on the GPU."""
    tiers = dict(s.tiers)
    return not tiers.get(GPU) and any(n > 0 for t, n in tiers.items() if t != GPU)


def may_be_evicted(s: Session, now: float, min_idle_s: float = 0.0) -> bool:
    """:func:`evicted_to_tier` may record ``s`` on the tier: idle for ``min_idle_s`` at
    least and not recorded offloaded already (the caller looks its blocks up only then)."""
    return s.phase is Phase.IDLE and not offloaded(s) and now - s.last_turn_end >= min_idle_s


def evicted_to_tier(
    s: Session, chain_blocks: int, on_gpu: int, on_tier: int, now: float, min_idle_s: float = 0.0
) -> dict[int, int] | None:
    """The placement to record for ``s`` (module doc): ``{CPU: on_tier}`` when it is idle
    (for ``min_idle_s`` at least), not recorded offloaded already, fewer than its
    ``chain_blocks`` leading blocks are on its home's GPU (``on_gpu``) and the tier holds more
    of them (``on_tier``, a leading run); else None (leave it)."""
    if not may_be_evicted(s, now, min_idle_s):
        return None
    if on_gpu >= chain_blocks or on_tier <= on_gpu:
        return None
    return {CPU: min(on_tier, chain_blocks)}


def job_id(s: Session) -> str:
    """The engine-side id of the prefetch for a session's next turn (one per turn)."""
    return f"{s.deployment}/{s.tenant}/{s.session_id}#{s.turns}"


def due_prefetches(
    sessions: Sequence[Session],
    chains: Mapping[SessionKey, Sequence[int]],
    engines: Mapping[str, EngineLink],
    tracked: Mapping[SessionKey, Tracked],
    now: float,
    *,
    tick_s: float = 0.0,
    margin_ratio: float = 0.2,
    margin_s: float = 0.5,
) -> list[Due]:
    """The prefetches to start now (module doc), soonest predicted return first."""
    out: list[tuple[float, Due]] = []
    for s in sessions:
        link = engines.get(s.home_instance)
        chain = chains.get(s.key)
        if (
            s.phase is not Phase.IDLE
            or link is None
            or not link.has_tier
            or not chain
            or s.key in tracked
            or not offloaded(s)
            or s.predicted_return_at <= now
        ):
            continue
        tokens = len(chain) * link.block_size
        p = link.profile
        plan = plan_prefetch(
            s.predicted_return_at,
            now,
            fetch_cost_ms=fetch_ms(tokens, p.kv_bytes_per_token, TierLink.of(p)),
            recompute_cost_ms=recompute_ms(p, tokens, link.block_size),
            margin_ratio=margin_ratio,
            margin_s=margin_s,
        )
        if plan.fetch and plan.start_at <= now + tick_s:
            due = Due(s.key, s.home_instance, job_id(s), s.tenant, tuple(chain), plan)
            out.append((s.predicted_return_at, due))
    out.sort(key=lambda x: x[0])
    return [d for _, d in out]


def started(due: Due, turns: int, now: float) -> Tracked:
    """The record of a prefetch the engine accepted."""
    return Tracked(due.key, due.instance, due.job_id, turns, now, len(due.hashes))


def settle(
    tracked: Mapping[SessionKey, Tracked],
    sessions: Mapping[SessionKey, Session],
    reports: Mapping[str, Mapping[str, str] | None],
    now: float,
) -> Settled:
    """What became of the tracked prefetches (module doc). ``reports``: per engine that was
    asked, its jobs' states by id (None: it did not answer, nothing is known)."""
    out = Settled()
    for key, t in tracked.items():
        report = reports.get(t.instance)
        if report is not None and not t.done and not t.failed:
            state = report.get(t.job_id)
            if state == "done":
                t = replace(t, done=True)
                out.finished.append(t)
            elif state != "pending":  # failed, or lost with an engine restart
                t = replace(t, failed=True)
                out.failed.append(t)
        s = sessions.get(key)
        if s is not None and (s.turns > t.turns or s.phase is Phase.ACTIVE):
            if not t.failed:
                (out.used if t.done else out.late).append(t)
        elif (
            s is None
            or s.phase is Phase.ENDED
            or s.home_instance != t.instance
            or s.predicted_return_at <= now
        ):
            if not t.failed:
                out.expired.append(t)
        else:
            out.tracked[key] = t
    return out
