"""The stack's engines as a deployment of its autoscaler (``local`` driver). Pure: no I/O.

``tideserve up --engines N`` (or ``--prefill P --decode D``) no longer starts engine processes
itself: it applies one deployment to its autoscaler, which runs the engines with its local
driver and announces them on ``{prefix}:membership``, which the gateway follows (seeded by
``ListInstances``). What stays as before, by construction:

- names and ids: role ``engine`` (aggregated), ``prefill``, ``decode``; the driver's
  ``instance_id_format`` is ``{role}-{n}``, so the engines are ``engine-1``, ``engine-2``,
  ``prefill-1``, ... (ids, membership, logs in ``<state_dir>/logs/<id>.log``);
- ports: each role's ``ports`` are its slice of :func:`~services.stack.engines.plan_engines`
  (30001 + offset upward, or ``stack.engine_ports``); engines added later (``tideserve
  apply`` / a changed replica count) take the driver's range, which starts right after them;
- arguments: ``--block-size``, ``--profile``, ``--speedup``, ``--kv-blocks`` and
  ``--engine-arg`` words are the role's ``args``; a P/D fleet also gets ``--kv-data-plane
  --te-metadata-url`` (kvmeta's metadata endpoint), so its hand-off moves real KV bytes;
- a dead engine stays dead (reported; the gateway routes around it): restart policy
  ``never``. ``min_replicas`` is the count asked for, so no planner decision goes below it;
  the planner is off in the stack unless the configuration turns it on;
- real engines (``--engine vllm|sglang``): one ``engine`` role of the engine's own server,
  each instance with its kv-bridge sidecar (:mod:`services.stack.real_engines`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from services.common.local.spec import PortClaim
from services.stack.engines import MAX_ENGINES, EngineFleet, plan_engines
from services.stack.real_engines import real_role

__all__ = [
    "STACK_INSTANCE_IDS",
    "autoscaler_driver_env",
    "engine_args",
    "engine_port_claims",
    "engine_port_range",
    "stack_deployment",
]

STACK_INSTANCE_IDS = "{role}-{n}"
"""The local driver's ``instance_id_format`` in the stack: ``engine-1``, ``prefill-1``, ..."""

_ROLES = (("engine", "worker"), ("prefill", "prefill"), ("decode", "decode"))
"""(role name, role kind) in plan order: aggregated, prefill, decode."""

_RANGE = 100
"""Ports beyond the planned ones the driver may hand to engines added later."""


def engine_args(fleet: EngineFleet) -> tuple[str, ...]:
    """The engine arguments every role of the stack's deployment gets."""
    out = ["--block-size", str(fleet.block_size)]
    if fleet.profile is not None:
        out += ["--profile", fleet.profile]
    if fleet.speedup is not None:
        out += ["--speedup", f"{fleet.speedup:g}"]
    if fleet.kv_blocks is not None:
        out += ["--kv-blocks", str(fleet.kv_blocks)]
    if fleet.data_plane:  # P/D: the decode pulls the prompt's KV bytes from the prefill
        out += ["--kv-data-plane", "--te-metadata-url", str(fleet.te_metadata_url)]
    return (*out, *fleet.extra_args)


def stack_deployment(fleet: EngineFleet) -> dict[str, Any] | None:
    """The deployment spec (YAML data for :func:`services.common.planner.spec.parse_spec`) of
    ``fleet``, named after the scheduler's deployment; None when it has no engines.
    :func:`plan_engines`' ValueError passes through."""
    plans = plan_engines(fleet)
    if not plans:
        return None
    if fleet.real is not None:
        role = real_role(
            fleet.real,
            replicas=fleet.workers,
            max_replicas=MAX_ENGINES,
            ports=[p.port for p in plans],
            block_size=fleet.block_size,
            stream_prefix=fleet.stream_prefix,
            extra_args=fleet.extra_args,
        )
        return {"name": fleet.deployment, "kv_block_size": fleet.block_size, "roles": [role]}
    counts = {"engine": fleet.workers, "prefill": fleet.prefill, "decode": fleet.decode}
    kind_of = {"aggregated": "engine", "prefill": "prefill", "decode": "decode"}
    roles = []
    for name, kind in _ROLES:
        n = counts[name]
        if n == 0:
            continue
        roles.append(
            {
                "name": name,
                "role": kind,
                "replicas": n,
                "min_replicas": n,
                "max_replicas": MAX_ENGINES,
                "engine": "sim",
                "args": list(engine_args(fleet)),
                "restart_policy": "never",
                "ports": [p.port for p in plans if kind_of[p.role] == name],
            }
        )
    return {"name": fleet.deployment, "kv_block_size": fleet.block_size, "roles": roles}


def engine_port_range(fleet: EngineFleet) -> tuple[int, int]:
    """Where engines added later get their ports: right after the planned ones (after the
    highest explicit port), :data:`_RANGE` of them, capped at 65535."""
    plans = plan_engines(fleet)
    first = max((p.port for p in plans), default=fleet.base_port - 1) + 1
    first = min(first, 65535)
    return first, min(first + _RANGE - 1, 65535)


def autoscaler_driver_env(
    fleet: EngineFleet,
    *,
    host: str,
    state_dir: Path,
    stop_grace_s: float,
    planner_configured: bool,
) -> dict[str, str]:
    """The stack's autoscaler environment for running ``fleet`` with its local driver (logs
    and engine state under ``state_dir`` like every stack child, the pid record in
    ``<state_dir>/instances.json``), and the planner off unless ``planner_configured``."""
    low, high = engine_port_range(fleet)
    prefix = "TIDESERVE_AUTOSCALER__DRIVER__"
    env = {
        f"{prefix}KIND": "local",
        f"{prefix}LOCAL__HOST": host,
        f"{prefix}LOCAL__STATE_DIR": str(state_dir),
        f"{prefix}LOCAL__INSTANCE_ID_FORMAT": STACK_INSTANCE_IDS,
        f"{prefix}LOCAL__PORT_MIN": str(low),
        f"{prefix}LOCAL__PORT_MAX": str(high),
        f"{prefix}LOCAL__STOP_GRACE_S": f"{stop_grace_s:g}",
    }
    if not planner_configured:
        env["TIDESERVE_AUTOSCALER__PLANNER_ENABLED"] = "false"
    return env


def engine_port_claims(fleet: EngineFleet, host: str) -> tuple[PortClaim, ...]:
    """The planned engines' ports, checked free (and against every other port of the stack)
    before anything starts, as when ``up`` started the engines itself."""
    return tuple(PortClaim(p.name, p.role, host, p.port, "port", "") for p in plan_engines(fleet))
