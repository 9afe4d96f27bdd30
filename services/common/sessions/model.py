"""Value types of agent sessions (pure): the session record, its phase, keys and errors.

A session is keyed by (deployment, tenant, session id): a tenant never sees another
tenant's sessions, even under the same id. Errors carry a gRPC status name in ``code``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = [
    "InvalidSessionError",
    "Phase",
    "Session",
    "SessionError",
    "SessionKey",
    "SessionNotFoundError",
    "SessionsExhaustedError",
]

SessionKey = tuple[str, str, str]
"""(deployment, tenant, session id)."""


class SessionError(Exception):
    code = "INTERNAL"


class InvalidSessionError(SessionError):
    code = "INVALID_ARGUMENT"


class SessionNotFoundError(SessionError):
    code = "NOT_FOUND"


class SessionsExhaustedError(SessionError):
    code = "RESOURCE_EXHAUSTED"


class Phase(enum.StrEnum):
    ACTIVE = "active"  # a turn is being served
    IDLE = "idle"  # the last turn ended; the agent runs tools or waits on a person
    ENDED = "ended"  # final turn answered, ended explicitly, or idle past the timeout


@dataclass(frozen=True, slots=True)
class Session:
    """One agent session as kvmeta holds it. Times are epoch seconds; 0 = not yet."""

    deployment: str
    tenant: str
    session_id: str
    parent_session_id: str = ""
    agent: str = ""
    phase: Phase = Phase.ACTIVE
    # the prefix chain tip: the last block hash of the session's context, and its tokens
    tip_hash: int = 0
    tip_tokens: int = 0
    home_instance: str = ""
    # blocks of the session's prefix per tier, (tier, blocks) in tier order
    tiers: tuple[tuple[int, int], ...] = ()
    turns: int = 0
    turn_started_at: float = 0.0
    last_turn_end: float = 0.0
    # the tools the last turn ended in calling; empty: it ended in an answer
    tool_names: tuple[str, ...] = ()
    predicted_return_at: float = 0.0
    prediction_samples: int = 0
    prediction_source: str = ""
    # the session's own latest gaps between a turn's end and the next turn's arrival
    recent_gaps: tuple[float, ...] = ()
    ended_at: float = 0.0
    updated_at: float = 0.0

    @property
    def key(self) -> SessionKey:
        return (self.deployment, self.tenant, self.session_id)

    @property
    def blocks(self) -> int:
        """Blocks of its prefix held anywhere."""
        return sum(n for _, n in self.tiers)
