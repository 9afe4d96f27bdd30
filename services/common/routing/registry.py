"""Plugin type registry: type name → (parameter model, factory).

Plugin classes register themselves with :func:`register`; the config loader validates
``params`` against the pydantic model (unknown keys refused) and calls
``cls(name, params, env)``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict

from services.common.tokens.hashing import DEFAULT_BLOCK_SIZE


class PrefillModel(Protocol):
    """The part of ``services.common.perfmodel.PerfProfile`` the scheduler uses."""

    def prefill_ms(self, uncached_tokens: int, cached_tokens: int = 0) -> float: ...


class DecodeModel(Protocol):
    """A model that also prices decode steps (``PerfProfile``, the fitted-model switch)."""

    def decode_step_ms(self, batch: int, context_tokens: int) -> float: ...


def decode_model(model: PrefillModel) -> DecodeModel | None:
    """``model`` when it prices decode steps, else None."""
    return model if callable(getattr(model, "decode_step_ms", None)) else None  # type: ignore[return-value]


def model_version(model: PrefillModel) -> int:
    """A model that can change under a plugin (the fitted one,
    ``services.scheduler.core.perf_switch``) carries a ``version`` that changes with it;
    a static profile has none (0). Plugins that derive figures from the model compare it."""
    return int(getattr(model, "version", 0))


def prefill_tps(model: PrefillModel, chunk_tokens: int) -> float:
    """The model's prefill throughput (tokens/s) on chunks of ``chunk_tokens``; a model
    that prices a chunk at 0 (none should: see ``perf_switch.plausible``) counts as one
    that takes a microsecond, not as a division by zero on the request path."""
    return 1000.0 * chunk_tokens / max(model.prefill_ms(chunk_tokens), 1e-3)


def _default_perf_resolver(name: str) -> PrefillModel:
    import importlib

    mod: Any = importlib.import_module("services.common.perfmodel")
    prof: PrefillModel = mod.get_profile(name or mod.DEFAULT_PROFILE)
    return prof


@dataclass(frozen=True)
class PluginEnv:
    """What plugin factories may use besides their params (injected for tests).

    ``decode_can_prefill``: whether the deployment's decode-role instances can compute a
    prompt themselves (simulated engines and vLLM can; an SGLang decode server in
    disaggregation mode cannot run a request without a prefill peer)."""

    perf_profile: Callable[[str], PrefillModel] = field(default=_default_perf_resolver)
    block_size: int = DEFAULT_BLOCK_SIZE
    decode_can_prefill: bool = True


class Params(BaseModel):
    """Base of every plugin's parameter model: unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class NoParams(Params):
    pass


P = TypeVar("P", bound=Params)
T = TypeVar("T", bound=type)


@dataclass(frozen=True)
class PluginType:
    type_name: str
    params: type[Params]
    factory: Callable[[str, Any, PluginEnv], object]
    doc: str


REGISTRY: dict[str, PluginType] = {}


def register(type_name: str, params: type[Params] = NoParams) -> Callable[[T], T]:
    """Class decorator: register ``cls(name, params, env)`` under ``type_name``."""

    def deco(cls: T) -> T:
        if type_name in REGISTRY:
            raise ValueError(f"plugin type {type_name!r} registered twice")
        REGISTRY[type_name] = PluginType(
            type_name,
            params,
            cls,
            (cls.__doc__ or "").strip(),
        )
        return cls

    return deco
