"""The session table (pure): agent sessions as turns start and end, predicted returns,
placement, expiry. No I/O, no clock: ``now`` (epoch seconds) is a parameter of every call.

Lifecycle: :meth:`SessionTable.turn_start` makes a session ACTIVE (creating it if new,
reopening it if it had ended); :meth:`~SessionTable.turn_end` makes it IDLE with a predicted
return (``now`` plus the :class:`ToolTimePredictor` percentile of the gap after the tools the
turn ended in), or ENDED when the turn was final. The next ``turn_start`` of an IDLE session
is an observation: its gap since the last turn's end teaches the predictor and joins the
session's own recent gaps. :meth:`~SessionTable.expire` ends sessions idle (or stuck active)
longer than ``idle_timeout_s`` and forgets ended ones after ``ended_retention_s``.

A turn end without a turn start (the start was lost) creates the session. Several turns of
one session in flight at once keep it ACTIVE; the first end makes it IDLE. Every mutating
call validates before it changes anything and records the changed rows for the shell
(:meth:`~SessionTable.drain_changes`; ``None`` = deleted).

The predictor's distributions live in memory only; the sessions' recent gaps are part of
their rows, so after a restart predictions fall back to the predictor's priors (where a shell
installed some, :meth:`~services.common.sessions.tooltime.ToolTimePredictor.set_priors`) and
each session's own history until the distributions are confident again.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

from services.common.kvindex.events import TIERS
from services.common.sessions.model import (
    InvalidSessionError,
    Phase,
    Session,
    SessionKey,
    SessionNotFoundError,
    SessionsExhaustedError,
)
from services.common.sessions.tooltime import ToolTimePredictor

__all__ = ["SessionTable"]

Changes = dict[SessionKey, Session | None]


def _require(key: SessionKey, now: float) -> None:
    dep, _tenant, sid = key
    if not dep or not sid:
        raise InvalidSessionError("deployment and session_id must not be empty")
    if not math.isfinite(now) or now < 0:
        raise InvalidSessionError(f"time must be finite and >= 0, got {now}")


def _tiers(tiers: Mapping[int, int]) -> tuple[tuple[int, int], ...]:
    bad = [(t, n) for t, n in tiers.items() if t not in TIERS or n < 0]
    if bad:
        raise InvalidSessionError(f"tiers need a tier in {TIERS} and blocks >= 0, got {bad}")
    return tuple(sorted((t, n) for t, n in tiers.items() if n > 0))


class SessionTable:
    def __init__(
        self,
        predictor: ToolTimePredictor | None = None,
        *,
        percentile: float = 0.9,
        idle_timeout_s: float = 1800.0,
        ended_retention_s: float = 300.0,
        max_sessions: int = 1_000_000,
        recent_gaps: int = 8,
    ) -> None:
        if not 0.0 < percentile <= 1.0:
            raise ValueError(f"percentile must be in (0, 1], got {percentile}")
        if idle_timeout_s <= 0 or ended_retention_s < 0 or max_sessions < 1 or recent_gaps < 1:
            raise ValueError("idle_timeout_s > 0, ended_retention_s >= 0, max_sessions >= 1")
        self.predictor = predictor if predictor is not None else ToolTimePredictor()
        self.percentile = percentile
        self.idle_timeout_s = idle_timeout_s
        self.ended_retention_s = ended_retention_s
        self.max_sessions = max_sessions
        self.recent_gaps = recent_gaps
        self._rows: dict[SessionKey, Session] = {}
        self._changes: Changes = {}

    def __len__(self) -> int:
        return len(self._rows)

    # ------------------------------------------------------------------ turns

    def turn_start(
        self,
        key: SessionKey,
        now: float,
        *,
        parent_session_id: str = "",
        agent: str = "",
        home_instance: str = "",
    ) -> Session:
        """A turn of ``key`` arrived (module doc)."""
        _require(key, now)
        old = self._rows.get(key)
        if old is None:
            self._room()
            old = Session(*key, parent_session_id=parent_session_id, agent=agent)
        gaps = old.recent_gaps
        if old.phase is Phase.IDLE and old.last_turn_end > 0:
            gap = now - old.last_turn_end
            if gap >= 0:
                self.predictor.observe(old.tool_names, old.agent or agent, gap)
                gaps = (*gaps, gap)[-self.recent_gaps :]
        new = replace(
            old,
            parent_session_id=parent_session_id or old.parent_session_id,
            agent=agent or old.agent,
            phase=Phase.ACTIVE,
            home_instance=home_instance or old.home_instance,
            turns=old.turns + 1,
            turn_started_at=now,
            recent_gaps=gaps,
            predicted_return_at=0.0,
            prediction_samples=0,
            prediction_source="",
            ended_at=0.0,
            updated_at=now,
        )
        return self._put(new)

    def turn_end(
        self,
        key: SessionKey,
        now: float,
        *,
        tip_hash: int = 0,
        tip_tokens: int = 0,
        tool_names: Sequence[str] = (),
        final: bool = False,
        home_instance: str = "",
    ) -> Session:
        """A turn of ``key`` was answered; it ended in ``tool_names`` (empty: an answer)."""
        _require(key, now)
        if tip_tokens < 0:
            raise InvalidSessionError(f"tip_tokens must be >= 0, got {tip_tokens}")
        old = self._rows.get(key)
        if old is None:
            self._room()
            old = Session(*key, turns=1, turn_started_at=now)
        tools = tuple(sorted(set(tool_names)))
        base = replace(
            old,
            tip_hash=tip_hash or old.tip_hash,
            tip_tokens=tip_tokens or old.tip_tokens,
            home_instance=home_instance or old.home_instance,
            last_turn_end=now,
            tool_names=tools,
            # the turn just served left the prefix on the engine that served it: what was
            # recorded before (offloaded, prefetched) no longer describes it
            tiers=(),
            updated_at=now,
        )
        if final:
            new = replace(base, phase=Phase.ENDED, ended_at=now, predicted_return_at=0.0)
        else:
            est = self.predictor.predict(tools, old.agent, self.percentile, old.recent_gaps)
            new = replace(
                base,
                phase=Phase.IDLE,
                predicted_return_at=now + est.seconds,
                prediction_samples=est.samples,
                prediction_source=est.source,
            )
        return self._put(new)

    def set_placement(
        self, key: SessionKey, now: float, *, home_instance: str, tiers: Mapping[int, int]
    ) -> Session:
        """Where the session's prefix is: its home instance and blocks per tier."""
        _require(key, now)
        placed = _tiers(tiers)
        old = self._rows.get(key)
        if old is None:
            raise SessionNotFoundError(f"unknown session {key[2]!r}")
        new = replace(
            old, home_instance=home_instance or old.home_instance, tiers=placed, updated_at=now
        )
        return self._put(new)

    def end(self, key: SessionKey, now: float) -> Session:
        """End a session explicitly (idempotent for an ended one). NOT_FOUND if unknown."""
        _require(key, now)
        old = self._rows.get(key)
        if old is None:
            raise SessionNotFoundError(f"unknown session {key[2]!r}")
        if old.phase is Phase.ENDED:
            return old
        return self._put(replace(old, phase=Phase.ENDED, ended_at=now, updated_at=now))

    # ---------------------------------------------------------------- expiry

    def expire(self, now: float) -> tuple[list[Session], list[SessionKey]]:
        """End sessions quiet for ``idle_timeout_s``; forget those ended
        ``ended_retention_s`` ago. Returns (newly ended, forgotten keys)."""
        ended: list[Session] = []
        gone: list[SessionKey] = []
        for key, s in list(self._rows.items()):
            if s.phase is Phase.ENDED:
                if now - s.ended_at >= self.ended_retention_s:
                    del self._rows[key]
                    self._changes[key] = None
                    gone.append(key)
            elif now - max(s.turn_started_at, s.last_turn_end) >= self.idle_timeout_s:
                ended.append(self._put(replace(s, phase=Phase.ENDED, ended_at=now, updated_at=now)))
        return ended, gone

    # ----------------------------------------------------------------- reads

    def rows(self) -> list[Session]:
        """Every session held, any deployment and tenant (for the retention controller)."""
        return list(self._rows.values())

    def get(self, key: SessionKey) -> Session:
        s = self._rows.get(key)
        if s is None:
            raise SessionNotFoundError(f"unknown session {key[2]!r}")
        return s

    def list(
        self,
        deployment: str,
        tenant: str,
        *,
        phase: Phase | None = None,
        home_instance: str = "",
        limit: int = 0,
    ) -> list[Session]:
        """One tenant's sessions of a deployment, oldest update first; ``limit`` 0 = all."""
        out = [
            s
            for (d, t, _), s in self._rows.items()
            if d == deployment
            and t == tenant
            and (phase is None or s.phase is phase)
            and (not home_instance or s.home_instance == home_instance)
        ]
        out.sort(key=lambda s: (s.updated_at, s.session_id))
        return out[:limit] if limit > 0 else out

    # ------------------------------------------------------------ persistence

    def load(self, sessions: Iterable[Session]) -> None:
        """Replace the table with persisted rows (at start; records no changes)."""
        self._rows = {s.key: s for s in sessions}
        self._changes = {}

    def drain_changes(self) -> Changes:
        out, self._changes = self._changes, {}
        return out

    def requeue_changes(self, changes: Changes) -> None:
        """Put back rows a failed save did not write (newer changes win)."""
        for k, v in changes.items():
            self._changes.setdefault(k, v)

    # ------------------------------------------------------------------ helpers

    def _room(self) -> None:
        if len(self._rows) >= self.max_sessions:
            raise SessionsExhaustedError(
                f"{self.max_sessions} sessions held; end sessions or raise max_sessions"
            )

    def _put(self, s: Session) -> Session:
        self._rows[s.key] = s
        self._changes[s.key] = s
        return s
