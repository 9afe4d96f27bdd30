"""A deployment spec (the one ``tideserve apply -f`` takes, and ``tideserve recommend``
writes) as a simulated run's fleet (pure).

What the simulator takes from the spec:

- the fleet: the ``worker`` roles' replicas as aggregated engines, or the ``prefill`` and
  ``decode`` roles' as a P/D fleet (a spec with both kinds is refused: the simulator runs one
  layout);
- the ``kvcache`` roles as the agent-memory tier's size (``--agent-memory``): their replicas
  times each one's ``--kvcache-mib`` (default 1024) plus ``--kvcache-disk-mib``, unless the
  command line gives ``--memory-tier-mib``;
- ``scheduler_profile`` (the routing profile), ``perf_profile`` (the engines' performance
  profile) and ``kv_block_size``, where set;
- the engines' batch limits and KV blocks, where the engine roles' ``args`` set them
  (``--max-batch``, ``--max-batched-tokens``, ``--kv-blocks``, as ``tideserve engine``
  takes them and ``tideserve recommend`` writes them; the roles must agree: the simulator
  runs one engine configuration);
- the SLO: the targets of the highest-priority class that has one, unless the command line
  gives ``--slo-ttft-ms``/``--slo-tpot-ms``;
- with ``--autoscale``: the planner keeps each role within the spec's ``min_replicas`` (at
  least 1) and ``max_replicas`` (the simulator's planner has one bound for every role: the
  smallest minimum and the largest maximum), at the class's percentile, with the spec's
  ``planner`` settings (``--planner NAME=VALUE`` overrides one).

Everything else in a spec (images, ports, sidecars, budgets, coordination) is for the
drivers and has no simulated counterpart.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from services.common.planner.spec import DeploymentSpec, RoleSpec, SLOClassSpec
from services.sim.autoscale import AutoscaleConfig
from services.sim.config import SimConfig, SimConfigError

__all__ = ["engine_settings", "from_spec", "tier_mib"]

FLAGS = {"--max-batch": "max_batch", "--max-batched-tokens": "max_batched_tokens",
         "--kv-blocks": "kv_blocks"}  # fmt: skip
TIER_FLAGS = {"--kvcache-mib": "dram", "--kvcache-disk-mib": "disk"}
KVCACHE_MIB = 1024
"""A kvcache instance's DRAM segment without ``--kvcache-mib`` (``tideserve engine``'s)."""


def _flags(args: Sequence[str], flags: dict[str, str] = FLAGS) -> dict[str, int]:
    """The settings ``flags`` names in one role's ``args`` (``--flag N`` or ``--flag=N``)."""
    out: dict[str, int] = {}
    for i, a in enumerate(args):
        flag, eq, value = a.partition("=")
        if flag not in flags:
            continue
        if not eq:
            value = args[i + 1] if i + 1 < len(args) else ""
        try:
            out[flags[flag]] = int(value)
        except ValueError:
            raise SimConfigError(f"role args: {flag} takes an integer, got {value!r}") from None
    return out


def tier_mib(roles: Sequence[RoleSpec]) -> int | None:
    """The KV-cache tier's MiB the ``kvcache`` roles hold (None: no such role)."""
    tiers = [r for r in roles if r.role == "kvcache"]
    if not tiers:
        return None
    total = 0
    for r in tiers:
        got = _flags(r.args, TIER_FLAGS)
        total += r.replicas * (got.get("dram", KVCACHE_MIB) + got.get("disk", 0))
    return total


def engine_settings(roles: Sequence[RoleSpec]) -> dict[str, int]:
    """The batch limits and KV blocks the engine roles' args set (one value each: roles
    that disagree are refused)."""
    found: dict[str, int] = {}
    for r in roles:
        for name, v in _flags(r.args).items():
            if found.setdefault(name, v) != v:
                raise SimConfigError(
                    f"deployment: roles set {name} to {found[name]} and {v}; the simulator "
                    "runs one engine configuration"
                )
    return found


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
    cfg = replace(base, **engine_settings(scaled))  # type: ignore[arg-type]
    cfg = replace(
        cfg,
        engines=engines["worker"] or base.engines,
        prefill=engines["prefill"],
        decode=engines["decode"],
        profile=spec.scheduler_profile or base.profile,
        engine_profile=spec.perf_profile or base.engine_profile,
        block_size=spec.kv_block_size or base.block_size,
        slo_ttft_ms=base.slo_ttft_ms or (cls.ttft_ms if cls and cls.ttft_ms > 0 else None),
        slo_tpot_ms=base.slo_tpot_ms or (cls.tpot_ms if cls and cls.tpot_ms > 0 else None),
        memory_tier_mib=(
            base.memory_tier_mib if base.memory_tier_mib is not None else tier_mib(spec.roles)
        ),
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
            planner=tuple(sorted({**spec.planner.overrides(), **dict(auto.planner)}.items())),
        ))  # fmt: skip
    return cfg
