"""Which port a local engine listens on (the local driver's choice, bind probes only)."""

from __future__ import annotations

from collections.abc import Collection

from services.autoscaler.drivers.settings import LocalSettings
from services.common.local.ports import port_is_free
from services.common.planner.driver_base import DriverError, RoleTarget

__all__ = ["choose_port"]


def choose_port(role: RoleTarget, taken: Collection[int], s: LocalSettings) -> int:
    """The first of the role's ports no live instance holds (``taken``; DriverError when
    another process holds it), else the first free port of ``port_min..port_max``."""
    mine = [p for p in role.ports if p not in taken]
    if mine:
        if not port_is_free(s.host, mine[0]):
            raise DriverError(
                f"role {role.name}: its port {s.host}:{mine[0]} is in use by another process"
            )
        return mine[0]
    for port in range(s.port_min, s.port_max + 1):
        if port not in taken and port_is_free(s.host, port):
            return port
    raise DriverError(f"no free port in {s.port_min}..{s.port_max} on {s.host}")
