"""Tool-time observations from a stream of request records (pure).

A session's next turn arrives some time after its previous turn ended; that gap is what the
tools the previous turn called (or, for a turn that ended in an answer, the person) took.
:class:`TurnGaps` remembers, per session, when its latest turn ended and which tools it
called, and turns each later turn's arrival into an :class:`Observation` for
:class:`~services.common.sessions.tooltime.ToolTimePredictor`.

Records may arrive out of order (several gateway replicas, a stream's redelivery): a turn
that arrives before the remembered turn ended is no observation (it overlapped it, or is an
older turn arriving late), and an older turn never replaces a newer one as the remembered
one. A failed turn still ends the wait (the agent retries at once or gives up), so it is
remembered with no tools. At most ``max_sessions`` sessions are remembered, the least
recently seen dropped first.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Observation", "TurnGaps"]


@dataclass(frozen=True, slots=True)
class Observation:
    """The gap after a turn that ended in ``tools`` (empty: in an answer)."""

    tools: tuple[str, ...]
    agent: str
    gap_s: float


@dataclass(frozen=True, slots=True)
class _Last:
    arrival_s: float
    end_s: float
    tools: tuple[str, ...]


class TurnGaps:
    """Per session (any hashable key, e.g. (deployment, tenant, session id)), the latest
    turn seen; :meth:`turn` gives the observation a new turn makes."""

    def __init__(self, max_sessions: int = 100_000) -> None:
        if max_sessions < 1:
            raise ValueError("max_sessions must be >= 1")
        self.max_sessions = max_sessions
        self._last: OrderedDict[object, _Last] = OrderedDict()

    def __len__(self) -> int:
        return len(self._last)

    def turn(
        self,
        key: object,
        arrival_s: float,
        end_s: float,
        tools: Sequence[str],
        *,
        agent: str = "",
        ok: bool = True,
    ) -> Observation | None:
        """A turn of session ``key`` that arrived at ``arrival_s`` and ended at ``end_s``
        calling ``tools`` (``ok`` False: it failed). The observation it makes, if any."""
        last = self._last.get(key)
        obs = None
        if last is not None and arrival_s >= last.end_s and arrival_s > last.arrival_s:
            obs = Observation(last.tools, agent, arrival_s - last.end_s)
        if last is None or arrival_s > last.arrival_s:
            names = tuple(sorted(set(tools))) if ok else ()
            self._last[key] = _Last(arrival_s, max(end_s, arrival_s), names)
        if key in self._last:
            self._last.move_to_end(key)
        while len(self._last) > self.max_sessions:
            self._last.popitem(last=False)
        return obs
