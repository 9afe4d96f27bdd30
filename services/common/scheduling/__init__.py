"""The scheduler's service core (pure): fleet state, routing and admission in one object,
shared by the HTTP gateway and the gRPC servicer. ``build_core`` wires the pure cores from
plain values (settings are translated by the composition root)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path

from services.common.admission import AdmissionQueue, QueueConfig
from services.common.routing.config import DEFAULT_PROFILES_PATH, load_config
from services.common.routing.registry import PluginEnv, PrefillModel
from services.common.scheduling.fleet import EndpointSpec, Fleet, LoadReport
from services.common.scheduling.service import CoreLimits, GatewayCore, SLOTargets
from services.common.tokens.hashing import DEFAULT_BLOCK_SIZE

__all__ = [
    "CoreLimits",
    "EndpointSpec",
    "Fleet",
    "GatewayCore",
    "LoadReport",
    "SLOTargets",
    "build_core",
]


def build_core(
    endpoints: Sequence[EndpointSpec] = (),
    *,
    profiles: Path | None = None,
    seed: int = 0,
    block_size: int = DEFAULT_BLOCK_SIZE,
    perf_profile: str = "",
    queue: QueueConfig | None = None,
    limits: CoreLimits | None = None,
    slo: SLOTargets | None = None,
    decode_can_prefill: bool = True,
    perf_model: PrefillModel | None = None,
    scrape_queue_estimate: bool = False,
) -> GatewayCore:
    """A ready core. Raises ``ConfigError`` for a bad profiles file.

    ``perf_profile`` names the performance profile for ``ttft-cost`` plugins that do not
    name one themselves. ``decode_can_prefill``: whether decode-role instances can compute
    a prompt without a prefill peer (false for SGLang decode servers; see
    ``services.common.routing.registry.PluginEnv``). ``perf_model`` (e.g. the
    :class:`~services.scheduler.core.perf_switch.PerfModelSwitch` that telemetry's fit
    feeds) replaces the default profile for plugins that do not name one.
    ``scrape_queue_estimate``: see :class:`~services.common.scheduling.fleet.Fleet`."""
    base = PluginEnv()

    def resolve(name: str) -> PrefillModel:
        if not name and perf_model is not None:
            return perf_model
        return base.perf_profile(name or perf_profile)

    env = PluginEnv(
        perf_profile=resolve, block_size=block_size, decode_can_prefill=decode_can_prefill
    )
    sched = load_config(profiles or DEFAULT_PROFILES_PATH, env=env, rng=random.Random(seed))
    fleet = Fleet(scrape_queue_estimate=scrape_queue_estimate)
    for e in endpoints:
        fleet.upsert(e)
    return GatewayCore(sched, fleet, AdmissionQueue(queue), limits=limits, slo=slo)
