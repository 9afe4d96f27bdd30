"""Time in Tideserve, one convention everywhere.

- Pure cores never read a clock: time is a parameter (``now``, seconds).
- Shells take the clocks they read as plain callables, injected with defaults:
  ``clock: Callable[[], float] = time.monotonic`` for intervals, deadlines and TTLs within one
  process, and ``wall: Callable[[], float] = time.time`` (epoch seconds) for anything stamped,
  persisted or compared across processes (stream entries, heartbeats, leases, records).
- Tests and simulations drive both with :class:`ManualClock` (``clock=mc.monotonic``,
  ``wall=mc.now``).
"""

from __future__ import annotations

__all__ = ["ManualClock"]


class ManualClock:
    """A clock that moves only through :meth:`advance` / :meth:`set`.

    ``now()`` starts at ``start`` (epoch seconds); ``monotonic()`` starts at 0 and moves by the
    same amounts. Time never goes backwards: a negative step raises ``ValueError``.
    """

    def __init__(self, start: float = 0.0) -> None:
        self._start = float(start)
        self._elapsed = 0.0

    def now(self) -> float:
        return self._start + self._elapsed

    def monotonic(self) -> float:
        return self._elapsed

    def advance(self, dt: float) -> float:
        """Move both clocks forward by ``dt`` seconds (>= 0); returns the new ``now()``."""
        if dt < 0:
            raise ValueError(f"cannot move a clock backwards (dt={dt})")
        self._elapsed += dt
        return self.now()

    def set(self, now: float) -> None:
        """Jump forward to wall time ``now`` (>= current ``now()``)."""
        self.advance(now - self.now())
