"""Shared builders for the routing unit tests (not a test module)."""

from __future__ import annotations

import random
from typing import Any

import services.common.routing.plugins  # noqa: F401  (registers plugin types)
from services.common.routing.framework import CycleContext
from services.common.routing.registry import REGISTRY, PluginEnv
from services.common.routing.types import EndpointView, RequestView


class LinearModel:
    """Fake perf model: 0.1 ms per uncached token (10,000 tokens/s), cached tokens free."""

    def prefill_ms(self, uncached_tokens: int, cached_tokens: int = 0) -> float:
        return 0.1 * uncached_tokens


ENV = PluginEnv(perf_profile=lambda name: LinearModel(), block_size=4)


def ep(iid: str, **kw: Any) -> EndpointView:
    return EndpointView(instance_id=iid, url=f"http://{iid}", **kw)


def req(rid: str = "r", prompt_tokens: int = 16, **kw: Any) -> RequestView:
    kw.setdefault("block_size", 4)
    return RequestView(request_id=rid, prompt_tokens=prompt_tokens, **kw)


def ctx(now: float = 0.0, seed: int = 0) -> CycleContext:
    return CycleContext(now=now, rng=random.Random(seed))


def make(type_name: str, name: str | None = None, **params: Any) -> Any:
    spec = REGISTRY[type_name]
    return spec.factory(name or type_name, spec.params.model_validate(params), ENV)
