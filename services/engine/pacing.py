"""When the engine shell starts its next step on the modelled clock (pure).

A step of modelled duration ``d`` planned at ``t`` ends at ``t + d``. The shell's own work
between steps (waking from its sleep, handing outputs to the streams, parsing and
tokenising a new request, which a real engine does in another process) takes wall time
that is not in the model. Starting each step at the wall clock would add that work to every
step, and more of it to an engine that receives more requests: the simulator would then run
slower than its model, by a different amount per router. So the next step starts where the
last one was planned to end, and the shell catches up by sleeping less, as long as it is at
most ``catch_up_ms`` behind; further behind (a stall, an overloaded machine), the schedule
restarts from the wall clock. A step never starts before the newest request it may admit
arrived.
"""

from __future__ import annotations

from collections import deque

from services.common.engine_core.core import EngineCore
from services.engine.events import LoadFigures

__all__ = ["RateWindow", "core_figures", "step_start"]


def step_start(
    wall_ms: float, planned_end: float | None, newest_arrival_ms: float, catch_up_ms: float
) -> float:
    """The modelled start of the next step. ``planned_end``: the previous step's end, or
    None after an idle wait or a stall (then the wall clock)."""
    if planned_end is None or wall_ms - planned_end > catch_up_ms:
        return wall_ms
    return max(planned_end, min(newest_arrival_ms, wall_ms))


class RateWindow:
    """Tokens per second over the last ``span_ms`` of model time (the load figures' prefill
    and decode rates)."""

    def __init__(self, span_ms: float = 5000.0) -> None:
        self.span_ms = span_ms
        self._window: deque[tuple[float, int]] = deque()

    def add(self, at_ms: float, tokens: int) -> None:
        self._window.append((at_ms, tokens))

    def rate(self, now_ms: float) -> float:
        w = self._window
        while w and w[0][0] < now_ms - self.span_ms:
            w.popleft()
        return sum(n for _, n in w) / (self.span_ms / 1000.0)


def core_figures(
    c: EngineCore, finishing: int, prefill_tps: float, decode_tps: float
) -> LoadFigures:
    """The engine's load figures: the core's queues and cache, ``finishing`` sequences the
    step in progress still runs, and the measured token rates."""
    hit = c.cache.hit_tokens / c.cache.query_tokens if c.cache.query_tokens else 0.0
    return LoadFigures(
        num_running=c.num_running + finishing,
        num_waiting=c.num_waiting,
        kv_usage=c.cache.usage,
        kv_capacity_blocks=c.cache.capacity_blocks,
        tokens_in_flight=c.tokens_in_flight(),
        pending_prefill_tokens=c.pending_prefill_tokens(),
        prefill_tps=prefill_tps,
        decode_tps=decode_tps,
        cache_hit_rate=hit,
    )
