"""The local driver with real processes (the engine simulator and small Python commands):
launch and readiness with a measured start-up time, a crash restarted with back-off, a
command that keeps failing surfaced as FAILED without blocking ``scale``, one that cannot be
exec'd refused with DriverError, and scale-in that drains (engine load 0) before SIGTERM.
No scheduler runs here (the drainer watches the engine's own load); the e2e test with a
gateway under load is tests/e2e/test_autoscaler_scale_e2e.py."""

from __future__ import annotations

import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from services.autoscaler.drivers.base import (
    DriverError,
    InstanceState,
    InstanceStatus,
    Role,
    RoleTarget,
)
from services.autoscaler.drivers.drain import Drainer
from services.autoscaler.drivers.local import LocalDriver
from services.autoscaler.drivers.settings import LocalSettings
from services.stack.procs import ProcRef, is_alive, signal_process
from tests.helpers.ports import free_port
from tests.helpers.waits import eventually

pytestmark = pytest.mark.e2e

SIM_ARGS = ("--profile", "test", "--kv-blocks", "256")


@pytest.fixture
async def driver(tmp_path: Path) -> AsyncIterator[tuple[LocalDriver, list[tuple[str, str, str]]]]:
    base = free_port()
    settings = LocalSettings(
        port_min=base,
        port_max=base + 40,
        state_dir=str(tmp_path),
        probe_interval_s=0.1,
        stop_grace_s=5.0,
        restart_base_s=0.2,
        restart_max_s=1.0,
    )
    drv = LocalDriver(settings, Drainer([], timeout_s=10.0, poll_s=0.1))
    seen: list[tuple[str, str, str]] = []

    async def listen(status: InstanceStatus, reason: str) -> None:
        seen.append((status.instance_id, status.state.value, reason))

    drv.set_listener(listen)
    await drv.start()
    try:
        yield drv, seen
    finally:
        await drv.close()


def _states(seen: list[tuple[str, str, str]], iid: str) -> list[str]:
    return [s for i, s, _ in seen if i == iid]


async def test_scale_out_restart_and_drained_scale_in(
    driver: tuple[LocalDriver, list[tuple[str, str, str]]],
) -> None:
    drv, seen = driver
    role = RoleTarget("dep", "w", Role.WORKER, 2, args=SIM_ARGS, startup_timeout_s=90)
    await drv.scale(role, 2)
    await drv.scale(role, 2)  # idempotent: nothing more launched
    assert len(drv.instances("dep")) == 2

    async def all_ready() -> bool:
        return [i.state for i in drv.instances("dep")] == [InstanceState.READY] * 2

    await eventually(all_ready, within_s=90)
    first, second = drv.instances("dep")
    assert first.startup_ms > 0 and first.ready_ms >= first.started_ms

    # a crash: FAILED, then restarted on the same id and endpoint, READY again
    child = drv._instances[first.instance_id].child
    assert child is not None
    signal_process(child.ref, signal.SIGKILL)

    async def restarted() -> bool:
        now = {i.instance_id: i for i in drv.instances("dep")}
        i = now[first.instance_id]
        return i.state == InstanceState.READY and i.restarts == 1

    await eventually(restarted, within_s=90)
    again = {i.instance_id: i for i in drv.instances("dep")}[first.instance_id]
    assert again.endpoint == first.endpoint
    assert "exited with code" in again.last_error
    assert _states(seen, first.instance_id) == ["starting", "ready", "failed", "starting", "ready"]

    # scale-in: the most recently started READY one (the restarted one) is drained, then
    # stopped
    ref = drv._instances[first.instance_id].child.ref  # type: ignore[union-attr]
    await drv.scale(role, 1)
    assert [i.instance_id for i in drv.instances("dep")] == [second.instance_id]
    assert _states(seen, first.instance_id)[-2:] == ["draining", "stopped"]
    stop_reason = next(r for i, s, r in seen if i == first.instance_id and s == "stopped")
    assert stop_reason.startswith("scale-in: drained in"), stop_reason
    assert not is_alive(ref)


async def test_failures_are_surfaced_and_never_block(
    driver: tuple[LocalDriver, list[tuple[str, str, str]]],
) -> None:
    drv, _ = driver
    dies = RoleTarget(
        "dep", "bad", Role.WORKER, 1, command=(sys.executable, "-c", "import sys; sys.exit(3)")
    )
    await drv.scale(dies, 1)  # returns once launched

    async def failed_twice() -> bool:
        (inst,) = drv.instances("dep")
        return inst.restarts >= 2 and inst.state in (InstanceState.FAILED, InstanceState.STARTING)

    await eventually(failed_twice, within_s=30)
    (inst,) = drv.instances("dep")
    assert inst.last_error == "exited with code 3"
    await drv.scale(dies, 1)  # the failing instance counts: no replacement cascade
    assert len(drv.instances("dep")) == 1
    await drv.scale(dies, 0)  # and it can be removed (no drain: it never served)
    assert drv.instances("dep") == []

    missing = RoleTarget("dep", "x", Role.WORKER, 1, command=("/nonexistent/engine", "{port}"))
    with pytest.raises(DriverError, match="cannot start '/nonexistent/engine'"):
        await drv.scale(missing, 1)
    assert drv.instances("dep") == []


async def test_not_ready_in_time_is_a_failed_start(
    driver: tuple[LocalDriver, list[tuple[str, str, str]]],
) -> None:
    drv, seen = driver
    sleeper = RoleTarget(
        "dep",
        "slow",
        Role.WORKER,
        1,
        command=(sys.executable, "-c", "import time; time.sleep(600)"),
        startup_timeout_s=0.5,
    )
    await drv.scale(sleeper, 1)
    (inst,) = drv.instances("dep")
    ref: ProcRef = drv._instances[inst.instance_id].child.ref  # type: ignore[union-attr]

    async def timed_out() -> bool:
        return any(s == "failed" and "not ready within 0.5s" in r for _, s, r in seen)

    await eventually(timed_out, within_s=30)
    assert not is_alive(ref)
