"""The ``dry-run`` driver (advisory mode): decides and records, changes nothing.

Every :meth:`DryRunDriver.scale` whose arguments differ from the last one for that role is
recorded as a :class:`DryRunAction` (what a real driver would have been asked, and the
victims it would have drained, chosen exactly as the real drivers choose them from the
instances the caller says exist). It owns no instances.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from services.common.planner.driver_base import (
    DriverError,
    InstanceStatus,
    Listener,
    RoleTarget,
    choose_victims,
    counted,
)

__all__ = ["DryRunAction", "DryRunDriver"]


@dataclass(frozen=True)
class DryRunAction:
    """One change that was not made: ``role`` from ``current`` to ``replicas`` replicas,
    removing ``victims`` (scale-in only), at ``ts_ms``."""

    deployment: str
    role: str
    current: int
    replicas: int
    victims: tuple[str, ...]
    ts_ms: int


class DryRunDriver:
    """Records scale requests; see the module docstring. ``observed``: the instances that
    exist elsewhere (for victim choice and ``current``); none by default."""

    name = "dry-run"

    def __init__(
        self,
        observed: Callable[[str], Sequence[InstanceStatus]] = lambda _d: (),
        *,
        wall: Callable[[], float] = time.time,
        keep: int = 1000,
    ) -> None:
        self._observed = observed
        self._wall = wall
        self._keep = keep
        self.actions: list[DryRunAction] = []
        self._last: dict[tuple[str, str], tuple[int, tuple[str, ...]]] = {}

    def set_listener(self, listener: Listener) -> None:
        del listener  # nothing ever changes state

    async def start(self) -> None:
        return None

    async def scale(self, role: RoleTarget, replicas: int, victims: Sequence[str] = ()) -> None:
        if replicas < 0:
            raise DriverError(f"role {role.name}: replicas {replicas} is negative")
        key = (role.deployment, role.name)
        if self._last.get(key) == (replicas, tuple(victims)):
            return
        self._last[key] = (replicas, tuple(victims))
        have = counted(self._observed(role.deployment), role.name)
        doomed = choose_victims(have, len(have) - replicas, victims)
        self.actions.append(
            DryRunAction(
                role.deployment,
                role.name,
                len(have),
                replicas,
                tuple(doomed),
                int(self._wall() * 1000),
            )
        )
        del self.actions[: -self._keep]

    def instances(self, deployment: str) -> Sequence[InstanceStatus]:
        del deployment
        return ()

    async def close(self) -> None:
        return None
