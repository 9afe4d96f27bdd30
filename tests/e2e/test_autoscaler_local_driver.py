"""The local driver with real processes (the engine simulator and small Python commands):
launch and readiness with a measured start-up time, a crash restarted with back-off, a
command that keeps failing surfaced as FAILED without blocking ``scale``, one that cannot be
exec'd refused with DriverError, scale-in that drains (engine load 0) before SIGTERM, the
``never`` restart policy, a role's own ports, and the pid record that lets the next driver
adopt (or stop) the engines of one that was killed.
No scheduler runs here (the drainer watches the engine's own load); the e2e test with a
gateway under load is tests/e2e/test_autoscaler_scale_e2e.py."""

from __future__ import annotations

import signal
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from services.autoscaler.drivers.drain import Drainer
from services.autoscaler.drivers.local import LocalDriver
from services.autoscaler.drivers.settings import LocalSettings
from services.common.local.procs import ProcRef, is_alive, signal_process
from services.common.local.recorded import read_recorded
from services.common.planner.driver_base import (
    DriverError,
    InstanceState,
    InstanceStatus,
    Role,
    RoleTarget,
)
from tests.helpers.autoscale import RecordingDrainer
from tests.helpers.ports import free_port, port_range
from tests.helpers.waits import eventually

pytestmark = pytest.mark.e2e

SIM_ARGS = ("--profile", "test", "--kv-blocks", "256")


@pytest.fixture
async def driver(tmp_path: Path) -> AsyncIterator[tuple[LocalDriver, list[tuple[str, str, str]]]]:
    first, last = port_range(41)
    settings = LocalSettings(
        port_min=first,
        port_max=last,
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


SLEEPER = (sys.executable, "-c", "import sys, time; time.sleep(600)", "{port}")
DIES = (sys.executable, "-c", "import sys; sys.exit(3)")


async def test_restart_policy_never_leaves_a_crash_failed(
    driver: tuple[LocalDriver, list[tuple[str, str, str]]],
) -> None:
    """Two roles crash the same way under one supervisor: ``always`` is restarted again and
    again while ``never`` stays FAILED, counted (not replaced) and removable."""
    drv, seen = driver
    never = RoleTarget("dep", "never", Role.WORKER, 1, command=DIES, restart="never")
    always = RoleTarget("dep", "always", Role.WORKER, 1, command=DIES)
    await drv.scale(never, 1)
    await drv.scale(always, 1)

    def by_role() -> dict[str, InstanceStatus]:
        return {i.role_name: i for i in drv.instances("dep")}

    async def always_restarted_twice() -> bool:
        return by_role()["always"].restarts >= 2

    await eventually(always_restarted_twice, within_s=30)
    dead = by_role()["never"]
    assert (dead.state, dead.restarts, dead.last_error) == (
        InstanceState.FAILED,
        0,
        "exited with code 3",
    )
    assert _states(seen, dead.instance_id) == ["starting", "failed"]
    # the record keeps the dead one (its last pid), so `tideserve status` shows it dead
    rec = {e.instance_id: e for e in read_recorded(drv.state_dir)}
    assert not is_alive(rec[dead.instance_id].ref)
    await drv.scale(never, 1)  # counted: no replacement
    assert [i.instance_id for i in drv.instances("dep") if i.role_name == "never"] == [
        dead.instance_id
    ]
    await drv.scale(never, 0)
    assert "never" not in by_role()


async def test_role_ports_first_then_the_range(
    driver: tuple[LocalDriver, list[tuple[str, str, str]]],
) -> None:
    drv, _ = driver
    mine = (free_port(), free_port())
    role = RoleTarget("dep", "w", Role.WORKER, 3, command=SLEEPER, ports=mine)
    await drv.scale(role, 3)
    assert sorted(i.instance_id for i in drv.instances("dep")) == ["dep-w-1", "dep-w-2", "dep-w-3"]
    ports = sorted(int(i.endpoint.rsplit(":", 1)[1]) for i in drv.instances("dep"))
    s = drv.settings
    assert set(mine) <= set(ports)
    (extra,) = set(ports) - set(mine)
    assert s.port_min <= extra <= s.port_max

    # scale in and out again: the freed role port is taken again before the range
    first = next(i for i in drv.instances("dep") if i.endpoint.endswith(f":{mine[0]}"))
    await drv.scale(role, 2, victims=[first.instance_id])
    await drv.scale(role, 3)
    assert any(i.endpoint.endswith(f":{mine[0]}") for i in drv.instances("dep"))
    assert first.instance_id not in {i.instance_id for i in drv.instances("dep")}  # new id


@pytest.mark.parametrize(
    ("spec_timeout_s", "limit"),
    [(0.0, None), (0.5, 0.5)],
    ids=["spec-0-driver-default", "spec-timeout-bounds-the-drain"],
)
async def test_scale_in_drains_within_the_specs_drain_timeout(
    tmp_path: Path, spec_timeout_s: float, limit: float | None
) -> None:
    """The role's ``drain_timeout_s`` (the spec's ``coordination.drain_timeout_s``) is what
    bounds the drain of its victims; 0 leaves the driver's own timeout."""
    first, last = port_range(11)
    settings = LocalSettings(port_min=first, port_max=last, state_dir=str(tmp_path),
                             probe_interval_s=0.1, stop_grace_s=5.0)  # fmt: skip
    drainer = RecordingDrainer([], timeout_s=10.0, poll_s=0.1)
    drv = LocalDriver(settings, drainer)
    await drv.start()
    try:
        role = RoleTarget("d", "w", Role.WORKER, 1, args=SIM_ARGS, startup_timeout_s=90,
                          drain_timeout_s=spec_timeout_s)  # fmt: skip
        await drv.scale(role, 1)

        async def ready() -> bool:
            return [i.state for i in drv.instances("d")] == [InstanceState.READY]

        await eventually(ready, within_s=90)
        (first_id,) = [i.instance_id for i in drv.instances("d")]
        await drv.scale(role, 0)
        assert drainer.limits == [limit]
        assert [res.drained for _, res in drainer.results] == [True]
        # drain and migrate: its sessions were to move after the drain (no instance stays)
        assert drainer.migrations == [(first_id, [])]
    finally:
        await drv.close()


async def test_a_range_port_taken_while_down_moves_the_restart(tmp_path: Path) -> None:
    """Another process binds the crashed instance's port before its restart: the restart
    takes another free port of the range (same id, new endpoint) instead of failing on
    the taken one again and again."""
    first, last = port_range(11)
    # a restart back-off far longer than it takes to bind the freed port below
    settings = LocalSettings(port_min=first, port_max=last, state_dir=str(tmp_path),
                             probe_interval_s=0.1, restart_base_s=5.0)  # fmt: skip
    drv = LocalDriver(settings, Drainer([], timeout_s=1.0, poll_s=0.1))
    await drv.start()
    try:
        role = RoleTarget("d", "w", Role.WORKER, 1, args=SIM_ARGS, startup_timeout_s=90)
        await drv.scale(role, 1)

        async def ready(restarts: int) -> bool:
            (i,) = drv.instances("d")
            return i.state == InstanceState.READY and i.restarts == restarts

        await eventually(lambda: ready(0), within_s=90)
        (before,) = drv.instances("d")
        port = int(before.endpoint.rsplit(":", 1)[1])
        signal_process(drv._instances[before.instance_id].child.ref, signal.SIGKILL)  # type: ignore[union-attr]
        with socket.socket() as squatter:
            squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past TIME_WAIT

            async def taken() -> bool:
                try:
                    squatter.bind(("127.0.0.1", port))
                except OSError:
                    return False
                squatter.listen()
                return True

            await eventually(taken, within_s=5)
            await eventually(lambda: ready(1), within_s=90)
            (after,) = drv.instances("d")
        assert after.instance_id == before.instance_id
        assert after.endpoint != before.endpoint
        assert first <= int(after.endpoint.rsplit(":", 1)[1]) <= last
    finally:
        await drv.close()


async def test_instance_id_format(tmp_path: Path) -> None:
    """``{role}-{n}`` (the local stack's names): numbered per role, unique across roles."""
    first, last = port_range(11)
    settings = LocalSettings(
        port_min=first, port_max=last, state_dir=str(tmp_path), instance_id_format="{role}-{n}"
    )
    drv = LocalDriver(settings, Drainer([], timeout_s=1.0, poll_s=0.1))
    await drv.start()
    try:
        await drv.scale(RoleTarget("d", "prefill", Role.PREFILL, 1, command=SLEEPER), 1)
        await drv.scale(RoleTarget("d", "decode", Role.DECODE, 2, command=SLEEPER), 2)
        ids = sorted(i.instance_id for i in drv.instances("d"))
        assert ids == ["decode-1", "decode-2", "prefill-1"]
    finally:
        await drv.close()


async def test_a_role_port_held_by_another_process_is_refused(
    driver: tuple[LocalDriver, list[tuple[str, str, str]]],
) -> None:
    drv, _ = driver
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        role = RoleTarget("dep", "w", Role.WORKER, 1, command=SLEEPER, ports=(port,))
        with pytest.raises(DriverError, match=f"its port 127.0.0.1:{port} is in use"):
            await drv.scale(role, 1)
    assert drv.instances("dep") == []


@pytest.mark.parametrize("wanted", [2, 0], ids=["adopted", "not-wanted-stopped"])
async def test_engines_of_a_killed_driver_are_recorded_and_adopted_by_the_next(
    driver: tuple[LocalDriver, list[tuple[str, str, str]]], wanted: int
) -> None:
    """The record names every live process (pid + start time); the engines of a driver that
    died without closing (they still run) are adopted by the next driver on the same state
    dir when a scale of their role wants them (same id and process, no new launch), and
    stopped when none does."""
    drv, _ = driver
    role = RoleTarget("dep", "w", Role.WORKER, 2, command=SLEEPER)
    await drv.scale(role, 2)
    recorded = read_recorded(drv.state_dir)
    assert sorted(e.instance_id for e in recorded) == sorted(
        i.instance_id for i in drv.instances("dep")
    )
    refs = [e.ref for e in recorded]
    assert all(is_alive(r) for r in refs)

    await drv.scale(role, 1)
    assert len(read_recorded(drv.state_dir)) == 1

    # as if drv had been SIGKILLed: its engines run on, and a new driver takes the dir over
    survivor = read_recorded(drv.state_dir)[0]
    drv._instances.clear()  # forget them, as a dead process would
    nxt = LocalDriver(drv.settings, Drainer([], timeout_s=1.0, poll_s=0.1))
    await nxt.start()
    try:
        assert is_alive(survivor.ref)  # kept for adoption
        await nxt.scale(role, wanted)
        if wanted:
            ids = sorted(i.instance_id for i in nxt.instances("dep"))
            assert survivor.instance_id in ids and len(ids) == wanted
            pids = {e.instance_id: e.pid for e in read_recorded(nxt.state_dir)}
            assert pids[survivor.instance_id] == survivor.pid  # the same process, adopted
            assert is_alive(survivor.ref)
        else:
            assert not is_alive(survivor.ref)
            assert read_recorded(nxt.state_dir) == []
    finally:
        await nxt.close()
    assert not is_alive(survivor.ref)  # closing the driver stops what it adopted
