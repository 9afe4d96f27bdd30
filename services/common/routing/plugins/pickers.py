"""Pickers: max-score (default), round-robin, random, power-of-two choices."""

from __future__ import annotations

from collections.abc import Sequence

from services.common.routing.framework import CycleContext, MaxScorePicker, Scored
from services.common.routing.registry import NoParams, Params, PluginEnv, register
from services.common.routing.types import RequestView


class MaxScoreParams(Params):
    random_ties: bool = False


@register("max-score", MaxScoreParams)
class MaxScore(MaxScorePicker):
    """Highest weighted score; ties → lowest instance id (or random with random_ties)."""

    def __init__(self, name: str, params: MaxScoreParams, env: PluginEnv) -> None:
        super().__init__(name, params.random_ties)


@register("round-robin", NoParams)
class RoundRobin:
    """Cycles through the candidates (ordered by instance id), ignoring scores.

    State: one counter per plugin instance, advanced once per pick."""

    def __init__(self, name: str, params: NoParams, env: PluginEnv) -> None:
        self.name = name
        self._next = 0

    def pick(self, ctx: CycleContext, request: RequestView, scored: Sequence[Scored]) -> Scored:
        chosen = scored[self._next % len(scored)]
        self._next += 1
        return chosen


@register("random", NoParams)
class RandomPick:
    """Uniformly random candidate from the cycle's injected RNG, ignoring scores."""

    def __init__(self, name: str, params: NoParams, env: PluginEnv) -> None:
        self.name = name

    def pick(self, ctx: CycleContext, request: RequestView, scored: Sequence[Scored]) -> Scored:
        return scored[ctx.rng.randrange(len(scored))]


@register("power-of-two", NoParams)
class PowerOfTwo:
    """Samples two distinct candidates with the injected RNG and keeps the higher score
    (tie → lower instance id). Pair it with a load scorer (e.g. least-load)."""

    def __init__(self, name: str, params: NoParams, env: PluginEnv) -> None:
        self.name = name

    def pick(self, ctx: CycleContext, request: RequestView, scored: Sequence[Scored]) -> Scored:
        if len(scored) == 1:
            return scored[0]
        i, j = sorted(ctx.rng.sample(range(len(scored)), 2))
        return scored[j] if scored[j].total > scored[i].total else scored[i]
