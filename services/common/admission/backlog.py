"""An instance's predicted prefill backlog, as one gateway's dispatch order keeps it (pure).

The backlog is what this gateway dispatched to the instance and has not seen a first byte
of: each prompt's predicted prefill (the perf model's, from its pick) scaled by the
instance's observed speed, counted down as time passes. What the engine shows corrects it:

* when a first byte comes before the prediction ran out, the backlog is cut to what is still
  outstanding;
* every first byte updates the speed, a moving average of observed over predicted time to
  the first byte, capped at 1. An engine faster than the model (or a canned upstream
  answering in microseconds) is not held back by a model that overrates its work. An engine
  slower than the model is never given more.

Other gateway replicas (:meth:`Backlog.set_foreign`): their dispatch orders' backlogs on the
instance, as their heartbeats report them (:mod:`services.common.scheduling.shared_state`),
add to this one's and run down as time passes, so that N replicas together hold an
instance's queue at the dispatch order's threshold instead of each filling it up to the
threshold with its own share. :meth:`Backlog.own_ms` is what this one reports.

Times are seconds on the caller's clock; figures in ms are said so.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["SPEED_ALPHA", "SPEED_FLOOR", "Backlog", "Dispatched"]

# Weight of each first byte in an instance's speed, and the lowest speed it can reach.
SPEED_ALPHA = 0.2
SPEED_FLOOR = 0.01

Dispatched = tuple[float, float, float, float]
"""(predicted ms as scaled, dispatched at, predicted first byte at, speed then)."""


def _below(a: float, b: float, hold: float) -> float:
    """When two backlogs running out at times ``a`` and ``b`` together fall to ``hold``:
    while both run, the sum falls twice as fast."""
    lo, hi = (a, b) if a <= b else (b, a)
    both = (a + b - hold) / 2.0
    return both if both <= lo else hi - hold


@dataclass(slots=True)
class Backlog:
    busy_until: float = 0.0  # predicted end of the dispatched prefill backlog (s)
    outstanding: dict[str, Dispatched] = field(default_factory=dict)  # by request id
    out_ms: float = 0.0  # the scaled predictions in ``outstanding``, summed
    speed: float = 1.0  # observed / predicted time to first byte, averaged, at most 1
    # predicted end of the other gateway replicas' backlog here (s; set_foreign)
    foreign_until: float = 0.0

    def own_ms(self, now: float) -> float:
        """This gateway's predicted prefill still ahead (ms)."""
        return max(0.0, self.busy_until - now) * 1000.0

    def ms(self, now: float) -> float:
        """Predicted prefill still ahead of a request dispatched now (ms): this gateway's
        plus the other replicas'."""
        return (max(0.0, self.busy_until - now) + max(0.0, self.foreign_until - now)) * 1000.0

    def falls_to(self, hold_ms: float) -> float:
        """When the whole backlog falls to ``hold_ms`` by prediction alone."""
        return _below(self.busy_until, self.foreign_until, hold_ms / 1000.0)

    def set_foreign(self, ms: float, now: float) -> bool:
        """The other replicas' backlog here is ``ms`` now; whether it fell."""
        until = now + max(0.0, ms) / 1000.0
        fell = until < self.foreign_until
        self.foreign_until = until
        return fell

    def add(self, rid: str, prefill_ms: float, now: float) -> None:
        """``rid`` was dispatched now with ``prefill_ms`` of predicted prefill."""
        scaled = prefill_ms * self.speed
        self.busy_until = max(self.busy_until, now) + scaled / 1000.0
        self.outstanding[rid] = (scaled, now, self.busy_until, self.speed)
        self.out_ms += scaled

    def settle(self, rid: str, now: float, observed: bool) -> Dispatched | None:
        """``rid``'s prefill is over (``observed``: its first byte came now, a speed sample);
        returns its dispatch entry, None if it was not outstanding."""
        entry = self.outstanding.pop(rid, None)
        if entry is None:
            return None
        _, at, due, speed = entry
        if observed and due > at:
            # observed over the model's own time to first byte (unscaled)
            ratio = min(1.0, max(SPEED_FLOOR, (now - at) * speed / (due - at)))
            self.speed += SPEED_ALPHA * (ratio - self.speed)
        # Still outstanding: at most the rest of their predictions; none: idle now.
        if self.outstanding:
            self.out_ms -= entry[0]
            self.busy_until = min(self.busy_until, now + max(0.0, self.out_ms) / 1000.0)
        else:
            self.out_ms = 0.0
            self.busy_until = now
        return entry
