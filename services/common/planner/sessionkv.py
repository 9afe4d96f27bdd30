"""The scale-in floor from the live agent sessions' KV (pure).

The SLA planner sizes a role for its running requests (rate, prompt and output lengths,
KV per running sequence). Agent sessions between two turns are not running requests, yet
their next turn wants its prefix back where it left it. When the fleet shrinks below what
holds the *active* sessions' prefixes, every turn queues for KV room, wherever it lands.

Rule, per role: with ``A`` the prefix tokens of the active sessions homed on the role's
instances (:func:`~services.common.sessions.migration.active_sessions`: a turn in flight, a
turn ended within the active window, or a predicted return ahead) and ``K`` the KV tokens
one instance holds, the floor is ``ceil(A / (K x headroom))``. The planner never scales
the role *in* below it; it is a floor on scale-in only, never a reason to scale out (a role
already below it holds), so a fleet whose sessions outgrew it keeps serving from the tier
as before. ``K`` unknown (0) or no active sessions: no floor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["SessionFloor", "session_floor"]

_EPS = 1e-9


@dataclass(frozen=True)
class SessionFloor:
    """A role's floor and what it came from (for the decision's reason)."""

    replicas: int
    active_tokens: int
    kv_tokens: int
    headroom: float

    def why(self) -> str:
        return (
            f"session-kv floor {self.replicas}: active sessions' prefixes "
            f"{self.active_tokens} tokens over {self.kv_tokens} KV tokens per instance "
            f"x {self.headroom:g}"
        )


def session_floor(active_tokens: int, kv_tokens: int, headroom: float) -> SessionFloor:
    """The replicas whose KV (x ``headroom``) holds ``active_tokens`` (0 when either is 0)."""
    if active_tokens <= 0 or kv_tokens <= 0 or headroom <= 0:
        return SessionFloor(0, max(0, active_tokens), max(0, kv_tokens), headroom)
    n = max(0, math.ceil(active_tokens / (kv_tokens * headroom) - _EPS))
    return SessionFloor(n, active_tokens, kv_tokens, headroom)
