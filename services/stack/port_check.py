"""The stack's port check before it starts anything."""

from __future__ import annotations

from collections.abc import Sequence

from services.common.local.ports import busy_ports
from services.common.local.spec import PortClaim
from services.stack.plan import duplicate_ports
from services.stack.signals import StartFailed

__all__ = ["check_ports"]


def check_ports(claims: Sequence[PortClaim]) -> None:
    """Raise StartFailed naming the owner and port of the first duplicate or busy port."""
    for first, second in duplicate_ports(claims):
        raise StartFailed(
            f"port conflict: {second.describe()} is also configured for {first.describe()}"
        )
    busy = busy_ports(claims)
    if busy:
        names = "; ".join(c.describe() for c in busy)
        raise StartFailed(
            f"port already in use: {names} (stop whatever holds it, or use --base-port-offset)"
        )
