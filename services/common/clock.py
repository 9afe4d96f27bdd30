"""Injectable clocks: pure cores take time as a parameter; shells read it from a ``Clock``.

``SystemClock`` reads the real clocks; ``ManualClock`` only moves when told (tests, simulation).
"""

from __future__ import annotations

import time
from typing import Protocol, runtime_checkable

__all__ = ["Clock", "ManualClock", "SystemClock"]


@runtime_checkable
class Clock(Protocol):
    """Source of time. ``now`` is wall time (epoch seconds); ``monotonic`` never goes back."""

    def now(self) -> float: ...

    def monotonic(self) -> float: ...


class SystemClock:
    """The real clocks: ``time.time()`` and ``time.monotonic()``."""

    def now(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()


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
