"""A deployment spec (the one ``tideserve apply -f`` takes, and ``tideserve recommend``
writes) as a simulated run's fleet (pure).

What the simulator takes from the spec:

- the fleet: the ``worker`` roles' replicas as aggregated engines, or the ``prefill`` and
  ``decode`` roles' as a P/D fleet (a spec with both kinds is refused: the simulator runs one
  layout); ``kvcache`` roles are not engines and are left out (the simulator's tier is its
  own, ``--agent-memory``);
- ``scheduler_profile`` (the routing profile), ``perf_profile`` (the engines' performance
  profile) and ``kv_block_size``, where set;
- the SLO: the targets of the highest-priority class that has one, unless the command line
  gives ``--slo-ttft-ms``/``--slo-tpot-ms``;
- with ``--autoscale``: the planner keeps each role within the spec's ``min_replicas`` (at
  least 1) and ``max_replicas`` (the simulator's planner has one bound for every role: the
  smallest minimum and the largest maximum), at the class's percentile.

Everything else in a spec (images, ports, sidecars, budgets, coordination) is for the
drivers and has no simulated counterpart.
"""

from __future__ import annotations

from dataclasses import replace

from services.autoscaler.spec import DeploymentSpec, SLOClassSpec
from services.sim.autoscale import AutoscaleConfig
from services.sim.config import SimConfig, SimConfigError

__all__ = ["from_spec"]


def _slo_class(spec: DeploymentSpec) -> SLOClassSpec | None:
    with_targets = [c for c in spec.slo_classes if c.ttft_ms > 0 or c.tpot_ms > 0]
    return max(with_targets, key=lambda c: c.priority, default=None)


def from_spec(spec: DeploymentSpec, base: SimConfig, *, autoscale: bool) -> SimConfig:
    """``base`` with the spec's fleet, profiles, block size, SLO and (``autoscale``)
    replica bounds; raises :class:`SimConfigError` for a spec the simulator cannot run."""
    engines = {kind: sum(r.replicas for r in spec.roles_of(kind)) for kind in
               ("worker", "prefill", "decode")}  # fmt: skip
    has = {kind for kind in engines if spec.roles_of(kind)}
    if "worker" in has and has & {"prefill", "decode"}:
        raise SimConfigError(f"deployment {spec.name}: both worker and prefill/decode roles")
    if not has or has == {"prefill"} or has == {"decode"}:
        raise SimConfigError(
            f"deployment {spec.name}: needs worker roles, or prefill and decode roles"
        )
    scaled = [r for r in spec.roles if r.role != "kvcache"]
    if autoscale:
        engines = {k: max(n, 1) if k in has else 0 for k, n in engines.items()}
    elif any(engines[k] < 1 for k in has):
        raise SimConfigError(f"deployment {spec.name}: a role has 0 replicas (without --autoscale)")
    cls = _slo_class(spec)
    cfg = replace(
        base,
        engines=engines["worker"] or base.engines,
        prefill=engines["prefill"],
        decode=engines["decode"],
        profile=spec.scheduler_profile or base.profile,
        engine_profile=spec.perf_profile or base.engine_profile,
        block_size=spec.kv_block_size or base.block_size,
        slo_ttft_ms=base.slo_ttft_ms or (cls.ttft_ms if cls and cls.ttft_ms > 0 else None),
        slo_tpot_ms=base.slo_tpot_ms or (cls.tpot_ms if cls and cls.tpot_ms > 0 else None),
    )
    if autoscale:
        auto = base.autoscale or AutoscaleConfig()
        cfg = replace(cfg, autoscale=replace(
            auto,
            min_replicas=max(1, min(r.min_replicas for r in scaled)),
            max_replicas=max(max(r.max_replicas for r in scaled), 1),
            ttft_ms=cfg.slo_ttft_ms or auto.ttft_ms,
            tpot_ms=cfg.slo_tpot_ms or auto.tpot_ms,
            percentile=cls.percentile if cls else auto.percentile,
        ))  # fmt: skip
    return cfg
