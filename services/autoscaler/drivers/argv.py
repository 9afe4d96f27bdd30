"""The command line of one local-driver instance (pure): the role's own command with its
placeholders substituted, or the tideserve engine simulator playing the role."""

from __future__ import annotations

import sys
from pathlib import Path

from services.autoscaler.drivers.base import DriverError, Role, RoleTarget

__all__ = ["render_argv"]

_SIM_ROLE = {
    Role.WORKER: "aggregated",
    Role.PREFILL: "prefill",
    Role.DECODE: "decode",
    Role.KVCACHE: "kvcache",  # a KV-cache tier segment (args: --kvmeta-address, --kvcache-mib)
}


def render_argv(
    target: RoleTarget,
    *,
    host: str,
    port: int,
    instance_id: str,
    state_dir: Path,
    python: str = sys.executable,
) -> tuple[str, ...]:
    """The command line of one instance (pure). The role's ``command`` with placeholders
    substituted, then its ``args``; without a command, the tideserve engine simulator on
    ``host:port`` with the role, deployment and id, then ``args``. DriverError for a
    placeholder that does not exist."""
    values = {
        "port": str(port),
        "host": host,
        "instance_id": instance_id,
        "role": target.role.value,
        "deployment": target.deployment,
    }
    try:
        words = [w.format(**values) for w in (*target.command, *target.args)]
    except (KeyError, IndexError, ValueError) as e:
        raise DriverError(f"role {target.name}: bad placeholder in the command line: {e}") from e
    if target.command:
        return tuple(words)
    sim_role = _SIM_ROLE[target.role]  # the simulator plays every role
    return (
        python, "-m", "services.cli", "engine",
        "--host", host, "--port", str(port), "--instance-id", instance_id,
        "--role", sim_role, "--deployment", target.deployment,
        "--state-dir", str(state_dir / instance_id),
        "--log-level", "WARNING",
        *words,
    )  # fmt: skip
