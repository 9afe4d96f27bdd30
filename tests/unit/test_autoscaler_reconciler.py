"""The reconciler shell over a fake driver (instances in memory, made READY by the test):
apply never blocks; steps follow dependencies; a failing driver is retried with back-off and
shown as "half-applied" until it succeeds; a long drain of one role holds up neither the
other roles nor a newer target; membership events go out through the publisher in order."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import replace

import pytest

from services.autoscaler.drivers.settings import DriverSettings
from services.autoscaler.reconciler import Reconciler
from services.common.planner.driver_base import (
    DeploymentTarget,
    DriverError,
    InstanceState,
    InstanceStatus,
    Listener,
    Role,
    RoleTarget,
    choose_victims,
    counted,
)
from tests.helpers.waits import eventually


class FakeDriver:
    """Instances in memory. Scale-out adds STARTING ones (the test calls :meth:`ready`);
    scale-in marks victims DRAINING and waits for ``drain_gate`` of their role before
    removing them. ``fail[role]`` errors are raised (one per call) first."""

    name = "fake"

    def __init__(self) -> None:
        self.insts: dict[str, InstanceStatus] = {}
        self.calls: list[tuple[str, int, tuple[str, ...]]] = []
        self.fail: dict[str, list[str]] = {}
        self.drain_gate: dict[str, asyncio.Event] = {}
        self._listener: Listener | None = None
        self._n = 0

    def set_listener(self, listener: Listener) -> None:
        self._listener = listener

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    def instances(self, deployment: str) -> Sequence[InstanceStatus]:
        return [i for i in self.insts.values() if i.deployment == deployment]

    async def _set(self, inst: InstanceStatus, reason: str) -> None:
        if inst.state == InstanceState.STOPPED:
            self.insts.pop(inst.instance_id, None)
        else:
            self.insts[inst.instance_id] = inst
        assert self._listener is not None
        await self._listener(inst, reason)

    async def ready(self, role: str) -> None:
        for i in list(self.insts.values()):
            if i.role_name == role and i.state == InstanceState.STARTING:
                await self._set(replace(i, state=InstanceState.READY, ready_ms=5), "ready")

    async def scale(self, role: RoleTarget, replicas: int, victims: Sequence[str] = ()) -> None:
        self.calls.append((role.name, replicas, tuple(victims)))
        errors = self.fail.get(role.name)
        if errors:
            raise DriverError(errors.pop(0))
        have = counted(self.instances(role.deployment), role.name)
        for _ in range(replicas - len(have)):
            self._n += 1
            iid = f"{role.name}-{self._n}"
            await self._set(InstanceStatus(iid, role.deployment, role.name, role.role,
                                           InstanceState.STARTING, f"http://h:{self._n}"), "new")  # fmt: skip
        doomed = choose_victims(have, len(have) - replicas, victims)
        for v in doomed:
            await self._set(replace(self.insts[v], state=InstanceState.DRAINING), "draining")
        if doomed and role.name in self.drain_gate:
            await self.drain_gate[role.name].wait()
        for v in doomed:
            await self._set(replace(self.insts[v], state=InstanceState.STOPPED), "stopped")


class FakePublisher:
    def __init__(self) -> None:
        self.events: list[tuple[str, int, str]] = []
        self.pending = 0

    async def publish(self, ev: object) -> bool:
        self.events.append((ev.instance.instance_id, ev.kind, ev.reason))  # type: ignore[attr-defined]
        return True

    async def flush(self) -> bool:
        return True


SETTINGS = DriverSettings(resync_s=0.05, retry_base_s=0.05, retry_max_s=0.2)


def _target(decode: int, prefill: int) -> DeploymentTarget:
    return DeploymentTarget(
        "d",
        (
            RoleTarget("d", "decode", Role.DECODE, decode),
            RoleTarget("d", "prefill", Role.PREFILL, prefill, dependencies=("decode",)),
        ),
        reason="test",
    )


@pytest.fixture
async def rec() -> tuple[Reconciler, FakeDriver, FakePublisher]:
    driver, pub = FakeDriver(), FakePublisher()
    r = Reconciler(driver, SETTINGS, pub)  # type: ignore[arg-type]
    await r.start()
    yield r, driver, pub  # type: ignore[misc]
    await r.stop()


def _summary(r: Reconciler) -> str:
    st = r.status("d")
    assert st is not None
    return st.summary


async def test_dependencies_then_converged_and_membership(
    rec: tuple[Reconciler, FakeDriver, FakePublisher],
) -> None:
    r, driver, pub = rec
    r.apply(_target(2, 1))  # returns at once
    await eventually(lambda: _true(len(driver.instances("d")) == 2))
    assert [c[0] for c in driver.calls] == ["decode"]  # prefill waits for decode to serve
    assert "prefill 0/1 ready; waits for decode to serve" in _summary(r)
    await driver.ready("decode")
    await eventually(lambda: _true(len(driver.instances("d")) == 3))
    await driver.ready("prefill")
    await eventually(lambda: _true(_summary(r) == "converged"))
    # ADDED for each, with the target's reason; STARTING is silent
    assert sorted(i for i, _, _ in pub.events) == ["decode-1", "decode-2", "prefill-3"]
    assert all(k == 1 and why == "ready (test)" for _, k, why in pub.events)


async def test_driver_errors_are_retried_and_shown(
    rec: tuple[Reconciler, FakeDriver, FakePublisher],
) -> None:
    r, driver, _ = rec
    driver.fail["decode"] = ["cannot start 'engine': quota", "cannot start 'engine': quota"]
    r.apply(_target(1, 0))
    await eventually(lambda: _true("half-applied" in _summary(r)))
    assert "error x" in _summary(r) and "quota" in _summary(r)
    await eventually(lambda: _true(len(driver.instances("d")) == 1))  # retried until it works
    await driver.ready("decode")
    await eventually(lambda: _true(_summary(r) == "converged"))
    assert [c for c in driver.calls if c[0] == "decode"][:3] == [("decode", 1, ())] * 3


async def test_a_long_drain_holds_up_nothing_else(
    rec: tuple[Reconciler, FakeDriver, FakePublisher],
) -> None:
    r, driver, _ = rec
    r.apply(_target(3, 0))
    await eventually(lambda: _true(len(driver.instances("d")) == 3))
    await driver.ready("decode")
    driver.drain_gate["decode"] = asyncio.Event()
    r.apply(_target(1, 0), {"decode": ["decode-2"]})
    await eventually(lambda: _true(_states(driver).count(InstanceState.DRAINING) == 2))
    assert ("decode", 1, ("decode-2",)) in driver.calls
    # while that drain waits, a newer target (more replicas) is acted on at once
    r.apply(_target(3, 0))
    await eventually(lambda: _true(_states(driver).count(InstanceState.STARTING) == 2))
    driver.drain_gate["decode"].set()
    await driver.ready("decode")
    await eventually(lambda: _true(_summary(r) == "converged"))
    assert len(driver.instances("d")) == 3


def _states(driver: FakeDriver) -> list[InstanceState]:
    return [i.state for i in driver.instances("d")]


async def _true(value: bool) -> bool:
    return value
