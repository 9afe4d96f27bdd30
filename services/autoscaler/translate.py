"""``tideserve.v1.DeploymentSpec`` ⇄ :class:`services.common.planner.spec.DeploymentSpec`.

Pure. ``spec_from_proto`` validates (raises :class:`SpecError` naming the field), so a
protobuf spec is refused exactly as the YAML one would be.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tideserve.v1 import common_pb2

from services.common.planner.spec import DeploymentSpec, parse_spec

__all__ = ["role_name", "spec_from_proto", "spec_to_proto"]

_ROLE = {
    "worker": common_pb2.ROLE_WORKER,
    "prefill": common_pb2.ROLE_PREFILL,
    "decode": common_pb2.ROLE_DECODE,
    "kvcache": common_pb2.ROLE_KVCACHE,
}
_ENGINE = {
    "sim": common_pb2.ENGINE_KIND_SIM,
    "sglang": common_pb2.ENGINE_KIND_SGLANG,
    "vllm": common_pb2.ENGINE_KIND_VLLM,
}
_PD = {
    "": common_pb2.PD_PROTOCOL_UNSPECIFIED,
    "sglang": common_pb2.PD_PROTOCOL_SGLANG_BOOTSTRAP,
    "vllm": common_pb2.PD_PROTOCOL_VLLM_TWO_STEP,
}


def _inverse(table: Mapping[str, int]) -> dict[int, str]:
    return {v: k for k, v in table.items()}


_ROLE_NAME, _ENGINE_NAME, _PD_NAME = _inverse(_ROLE), _inverse(_ENGINE), _inverse(_PD)


def role_name(role: int) -> str:
    """``ROLE_PREFILL`` -> ``"prefill"``; ``""`` for UNSPECIFIED or unknown values."""
    return _ROLE_NAME.get(role, "")


def spec_to_proto(spec: DeploymentSpec) -> common_pb2.DeploymentSpec:
    c = spec.coordination
    return common_pb2.DeploymentSpec(
        name=spec.name,
        model=spec.model,
        roles=[
            common_pb2.RoleSpec(
                name=r.name,
                role=_ROLE[r.role],
                replicas=r.replicas,
                min_replicas=r.min_replicas,
                max_replicas=r.max_replicas,
                engine_kind=_ENGINE[r.engine],
                engine_args=list(r.args),
                image=r.image,
                resources=dict(r.resources),
                dependencies=list(r.dependencies),
                template=r.template,
                restart_policy=r.restart_policy,
                ports=list(r.ports),
                sidecars=list(r.sidecars),
                startup_timeout_s=r.startup_timeout_s,
            )
            for r in spec.roles
        ],
        coordination=common_pb2.Coordination(
            min_pd_ratio=c.min_pd_ratio,
            max_pd_ratio=c.max_pd_ratio,
            scale_together=list(c.scale_together),
            drain_before_remove=c.drain_before_remove,
            drain_timeout_s=c.drain_timeout_s,
            max_skew_percent=c.max_skew_percent,
        ),
        slo_classes=[
            common_pb2.SLOClass(
                name=s.name,
                priority=s.priority,
                ttft_ms=s.ttft_ms,
                tpot_ms=s.tpot_ms,
                percentile=s.percentile,
                max_queue_ms=s.max_queue_ms,
            )
            for s in spec.slo_classes
        ],
        pd_protocol=_PD[spec.pd_protocol],
        scheduler_profile=spec.scheduler_profile,
        kv_block_size=spec.kv_block_size,
        perf_profile=spec.perf_profile,
        generation=spec.generation,
        budget=common_pb2.ReplicaBudget(
            max_replicas=spec.budget.max_replicas,
            group=spec.budget.group,
            priority=spec.budget.priority,
        ),
        planner=common_pb2.PlannerOverrides(
            policy=spec.planner.policy,
            predictor=spec.planner.predictor,
            max_utilization=spec.planner.max_utilization,
            decode_headroom=spec.planner.decode_headroom,
            stream_interval=spec.planner.stream_interval,
        ),
    )


def _enum(table: dict[int, str], value: int, default: str | None = None) -> str | int:
    """The domain name of an enum value; an unknown value is passed on for the validator
    to refuse with the field's name (UNSPECIFIED -> ``default`` when given)."""
    if value == 0 and default is not None:
        return default
    return table.get(value, value)


def spec_from_proto(msg: common_pb2.DeploymentSpec) -> DeploymentSpec:
    """Validate and convert; :class:`SpecError` naming the field for a bad spec.

    UNSPECIFIED engine kind means ``sim``; an UNSPECIFIED role kind is refused (the role's
    name is used when it is itself a role kind, e.g. a role called "decode")."""
    c = msg.coordination
    data: dict[str, Any] = {
        "name": msg.name,
        "model": msg.model,
        "roles": [
            {
                "name": r.name,
                "role": _enum(_ROLE_NAME, r.role, r.name if r.role == 0 else None),
                "replicas": r.replicas,
                "min_replicas": r.min_replicas,
                "max_replicas": r.max_replicas,
                "engine": _enum(_ENGINE_NAME, r.engine_kind, "sim"),
                "args": list(r.engine_args),
                "image": r.image,
                "resources": dict(r.resources),
                "dependencies": list(r.dependencies),
                "template": r.template,
                "restart_policy": r.restart_policy or "always",
                "ports": list(r.ports),
                "sidecars": list(r.sidecars),
                "startup_timeout_s": r.startup_timeout_s,
            }
            for r in msg.roles
        ],
        "coordination": {
            "min_pd_ratio": c.min_pd_ratio,
            "max_pd_ratio": c.max_pd_ratio,
            "scale_together": list(c.scale_together),
            "drain_before_remove": c.drain_before_remove if msg.HasField("coordination") else True,
            "drain_timeout_s": c.drain_timeout_s,
            "max_skew_percent": c.max_skew_percent,
        },
        "slo_classes": [
            {
                "name": s.name,
                "priority": s.priority,
                "ttft_ms": s.ttft_ms,
                "tpot_ms": s.tpot_ms,
                "percentile": s.percentile or 90.0,
                "max_queue_ms": s.max_queue_ms,
            }
            for s in msg.slo_classes
        ],
        "pd_protocol": _enum(_PD_NAME, msg.pd_protocol, ""),
        "scheduler_profile": msg.scheduler_profile,
        "kv_block_size": msg.kv_block_size,
        "perf_profile": msg.perf_profile,
        "generation": msg.generation,
        "budget": {
            "max_replicas": msg.budget.max_replicas,
            "group": msg.budget.group,
            "priority": msg.budget.priority,
        },
        "planner": {
            "policy": msg.planner.policy,
            "predictor": msg.planner.predictor,
            "max_utilization": msg.planner.max_utilization,
            "decode_headroom": msg.planner.decode_headroom,
            "stream_interval": msg.planner.stream_interval,
        },
    }
    return parse_spec(data)
