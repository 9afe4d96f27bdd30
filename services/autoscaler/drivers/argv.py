"""The command lines of one local-driver instance (pure): the role's own command with its
placeholders substituted, or the tideserve engine simulator playing the role; and its
sidecars'."""

from __future__ import annotations

import sys
from pathlib import Path

from services.common.planner.driver_base import DriverError, Role, RoleTarget

__all__ = ["render_argv", "render_sidecars"]

_SIM_ROLE = {
    Role.WORKER: "aggregated",
    Role.PREFILL: "prefill",
    Role.DECODE: "decode",
    Role.KVCACHE: "kvcache",  # a KV-cache tier segment (args: --kvmeta-address, --kvcache-mib)
}


def _values(
    target: RoleTarget, host: str, port: int, instance_id: str, state_dir: Path
) -> dict[str, str]:
    return {
        "port": str(port),
        "host": host,
        "instance_id": instance_id,
        "role": target.role.value,
        "deployment": target.deployment,
        "state_dir": str(state_dir / instance_id),
    }


def _render(target: RoleTarget, words: tuple[str, ...], values: dict[str, str]) -> list[str]:
    try:
        return [w.format(**values) for w in words]
    except (KeyError, IndexError, ValueError) as e:
        raise DriverError(f"role {target.name}: bad placeholder in the command line: {e}") from e


def render_sidecars(
    target: RoleTarget, *, host: str, port: int, instance_id: str, state_dir: Path
) -> list[tuple[str, ...]]:
    """The sidecars' command lines of one instance (pure); DriverError as :func:`render_argv`."""
    values = _values(target, host, port, instance_id, state_dir)
    return [tuple(_render(target, words, values)) for words in target.sidecars]


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
    substituted (``{state_dir}``: ``state_dir/instance_id``), then its ``args``; without a
    command, the tideserve engine simulator on ``host:port`` with the role, deployment and
    id, then ``args``. DriverError for a placeholder that does not exist."""
    values = _values(target, host, port, instance_id, state_dir)
    words = _render(target, (*target.command, *target.args), values)
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
