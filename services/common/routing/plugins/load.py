"""Load plugins: least-load scorer and the load-balance guard filter."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

from pydantic import Field

from services.common.routing.framework import CycleContext, by_instance
from services.common.routing.registry import Params, PluginEnv, register
from services.common.routing.types import EndpointView, RequestView


class LeastLoadParams(Params):
    waiting: float = Field(1.0, ge=0)
    running: float = Field(0.5, ge=0)
    tokens_in_flight: float = Field(1.0, ge=0)
    kv_usage: float = Field(1.0, ge=0)


def _metrics(e: EndpointView) -> tuple[float, float, float, float]:
    return (
        float(e.waiting + e.reserved_requests),
        float(e.running),
        float(e.tokens_in_flight + e.reserved_tokens),
        e.kv_usage,
    )


@register("least-load", LeastLoadParams)
class LeastLoad:
    """Score = 1 - weighted mean of each load metric divided by its maximum over the
    candidates (waiting incl. this gateway's reservations, running, tokens in flight incl.
    reserved tokens, KV usage). An idle endpoint scores 1; equal loads score equally."""

    def __init__(self, name: str, params: LeastLoadParams, env: PluginEnv) -> None:
        self.name = name
        self.weights = (params.waiting, params.running, params.tokens_in_flight, params.kv_usage)
        self.total_weight = sum(self.weights)

    def score(
        self, ctx: CycleContext, request: RequestView, candidates: Sequence[EndpointView]
    ) -> Mapping[str, float]:
        return by_instance(candidates, self.score_list(ctx, request, candidates))

    def score_list(
        self, ctx: CycleContext, request: RequestView, candidates: Sequence[EndpointView]
    ) -> list[float]:
        """:meth:`score` aligned with ``candidates``."""
        if self.total_weight <= 0:
            return [1.0] * len(candidates)
        if not candidates:
            return []
        waiting = [float(e.waiting + e.reserved_requests) for e in candidates]
        running = [float(e.running) for e in candidates]
        tokens = [float(e.tokens_in_flight + e.reserved_tokens) for e in candidates]
        kv = [e.kv_usage for e in candidates]
        # weight / (max * total weight) per metric; 0 where the metric is 0 everywhere.
        f0, f1, f2, f3 = (
            w / (m * self.total_weight) if m > 0 else 0.0
            for w, m in zip(
                self.weights, (max(waiting), max(running), max(tokens), max(kv)), strict=True
            )
        )
        return [
            1.0 - (a * f0 + b * f1 + c * f2 + d * f3)
            for a, b, c, d in zip(waiting, running, tokens, kv, strict=True)
        ]


class LoadGuardParams(Params):
    abs_threshold: float = Field(16.0, ge=0)
    rel_threshold: float = Field(1.5, ge=1.0)
    metric: Literal["requests", "tokens"] = "requests"
    # Never remove an instance estimated to hold at least this many of the request's prompt
    # tokens (0 = off): moving a long session re-prefills its whole context, fleet work a
    # request count cannot weigh; the cost plugins price that choice instead.
    keep_cached_tokens: int = Field(0, ge=0)


@register("load-guard", LoadGuardParams)
class LoadGuard:
    """Spill off hot instances (like sglang-router's balance thresholds): an endpoint is
    removed when its load exceeds the least-loaded candidate's by more than
    ``abs_threshold`` AND is more than ``rel_threshold`` times it, unless it holds at least
    ``keep_cached_tokens`` of the request's prompt. Never empties the set."""

    def __init__(self, name: str, params: LoadGuardParams, env: PluginEnv) -> None:
        self.name = name
        self.p = params

    def _load(self, e: EndpointView) -> float:
        if self.p.metric == "tokens":
            return float(e.tokens_in_flight + e.reserved_tokens)
        return float(e.queue_load)

    def filter(
        self, ctx: CycleContext, request: RequestView, candidates: Sequence[EndpointView]
    ) -> Sequence[EndpointView]:
        if len(candidates) < 2:
            return candidates
        if self.p.metric == "tokens":
            loads = [float(e.tokens_in_flight + e.reserved_tokens) for e in candidates]
        else:
            loads = [float(e.running + e.waiting + e.reserved_requests) for e in candidates]
        lo = min(loads)
        # Removed iff x - lo > abs AND x > rel * lo, i.e. kept iff x <= max(lo + abs, rel * lo).
        cut = max(lo + self.p.abs_threshold, self.p.rel_threshold * lo)
        keep = self.p.keep_cached_tokens
        if keep:
            cached = ctx.cached_tokens.get
            return [
                e
                for e, x in zip(candidates, loads, strict=True)
                if x <= cut or cached(e.instance_id, 0) >= keep
            ]
        return [e for e, x in zip(candidates, loads, strict=True) if x <= cut]
