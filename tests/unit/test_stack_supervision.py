"""Supervision with real child processes: tiny grpc health servers stand in for services.

The runner under test (`StackRunner`) is the real one; the stand-ins are real processes that
really serve grpc.health.v1, so readiness, failure and stop paths are exercised for real.
External database URLs are given so no embedded server starts and no migration runs here
(the e2e test covers those).
"""

from __future__ import annotations

import dataclasses
import io
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.common.local.ports import port_is_free
from services.common.local.procs import ProcRef, is_alive, stop_processes
from services.common.local.spec import ChildSpec, PortClaim
from services.common.local.state import ProcEntry, StackState, read_state, write_state
from services.stack.control import stack_down
from services.stack.restarts import RestartPolicy
from services.stack.up import StackRunner
from tests.helpers.ports import free_port
from tests.helpers.supervision import NO_INFRA, STANDIN, options, run, spec


@pytest.fixture
def standin(tmp_path: Path) -> Path:
    path = tmp_path / "standin.py"
    path.write_text(STANDIN)
    return path


@pytest.fixture
def no_leftovers() -> Iterator[list[ProcRef]]:
    refs: list[ProcRef] = []
    yield refs
    alive = [r for r in refs if is_alive(r)]
    stop_processes(alive, 1.0)
    assert not alive, f"left running: {alive}"


def test_up_serves_then_stops_everything_on_sigterm(
    tmp_path: Path, standin: Path, no_leftovers: list[ProcRef]
) -> None:
    ports = [free_port(), free_port()]
    children = [spec(standin, tmp_path, f"svc{i}", p) for i, p in enumerate(ports)]
    out, err = io.StringIO(), io.StringIO()
    rc, seen = run(
        StackRunner(options(tmp_path), children, NO_INFRA, out=out, err=err), stop_when_running=True
    )
    no_leftovers.extend(p.ref for p in seen)
    assert rc == 0, err.getvalue()
    assert [p.name for p in seen] == ["svc0", "svc1"]
    assert f"gRPC 127.0.0.1:{ports[0]}" in out.getvalue()
    assert "postgresql://u:***@db.invalid/x" in out.getvalue()  # external, password hidden
    assert not any(is_alive(p.ref) for p in seen)
    assert read_state(tmp_path) is None
    assert all(port_is_free("127.0.0.1", p) for p in ports)


@pytest.mark.parametrize(
    ("mode", "needle"),
    [
        ("exit3", "svc1 exited with code 3: stand-in: configured to fail"),
        ("not-serving", "svc1 NOT_SERVING"),
    ],
    ids=["child-exits", "never-serving"],
)
def test_failed_start_stops_what_was_started(
    tmp_path: Path, standin: Path, mode: str, needle: str, no_leftovers: list[ProcRef]
) -> None:
    children = [
        spec(standin, tmp_path, "svc0", free_port()),
        spec(standin, tmp_path, "svc1", free_port(), mode),
    ]
    err = io.StringIO()
    runner = StackRunner(
        options(tmp_path, start_timeout_s=4.0), children, NO_INFRA, out=io.StringIO(), err=err
    )
    rc = runner.run()
    refs = [c.ref for c in runner.supervisor.children]
    no_leftovers.extend(refs)
    assert rc == 1
    assert needle in err.getvalue()
    assert len(refs) == 2 and not any(is_alive(r) for r in refs)
    assert read_state(tmp_path) is None


def test_child_dying_while_running_stops_the_stack(
    tmp_path: Path, standin: Path, no_leftovers: list[ProcRef]
) -> None:
    children = [
        spec(standin, tmp_path, "svc0", free_port()),
        spec(standin, tmp_path, "svc1", free_port(), "die-later"),
    ]
    err = io.StringIO()
    runner = StackRunner(options(tmp_path), children, NO_INFRA, out=io.StringIO(), err=err)
    rc, _ = run(runner, stop_when_running=False)
    no_leftovers.extend(c.ref for c in runner.supervisor.children)
    assert rc == 1
    assert "svc1 exited with code 4: stand-in: dying" in err.getvalue()
    assert not any(is_alive(c.ref) for c in runner.supervisor.children)


def test_dying_service_is_restarted_until_it_crash_loops(
    tmp_path: Path, standin: Path, no_leftovers: list[ProcRef]
) -> None:
    children = [
        spec(standin, tmp_path, "svc0", free_port()),
        spec(standin, tmp_path, "svc1", free_port(), "die-later"),
    ]
    err = io.StringIO()
    policy = RestartPolicy(max_restarts=2, window_s=600.0, base_delay_s=0.1, max_delay_s=0.2)
    opts = options(tmp_path, restarts=policy)
    runner = StackRunner(opts, children, NO_INFRA, out=io.StringIO(), err=err)
    rc, _ = run(runner, stop_when_running=False)
    no_leftovers.extend(c.ref for c in runner.supervisor.children)
    text = err.getvalue()
    assert rc == 1, text
    assert text.count("stand-in: dying (log:") == 3, text  # the first run and two restarts
    assert text.count("restarted svc1 (pid") == 2, text
    assert "svc1 was restarted 2 times within 600s; not restarting it again" in text
    assert "stopping the stack" in text
    assert (tmp_path / "logs" / "svc1.log").read_text().count("stand-in: dying") == 3
    assert not any(is_alive(c.ref) for c in runner.supervisor.children)


def test_child_ignoring_sigterm_is_killed(
    tmp_path: Path, standin: Path, no_leftovers: list[ProcRef]
) -> None:
    children = [spec(standin, tmp_path, "stubborn", free_port(), "ignore-term")]
    err = io.StringIO()
    runner = StackRunner(
        options(tmp_path, stop_timeout_s=1.0), children, NO_INFRA, out=io.StringIO(), err=err
    )
    rc, seen = run(runner, stop_when_running=True)
    no_leftovers.extend(p.ref for p in seen)
    assert rc == 0
    assert "killed after 1s: stubborn" in err.getvalue()
    assert not is_alive(seen[0].ref)


@pytest.mark.parametrize("holder", ["child", "redis"], ids=["service-port", "embedded-redis-port"])
def test_port_in_use_names_owner_and_port_and_starts_nothing(
    tmp_path: Path, standin: Path, holder: str
) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        child_port = port if holder == "child" else free_port()
        opts = (
            options(tmp_path, redis_url=None, redis_port=port)
            if holder == "redis"
            else options(tmp_path)
        )
        children = [
            spec(standin, tmp_path, "svc0", free_port()),
            spec(standin, tmp_path, "kvmeta", child_port),
        ]
        err = io.StringIO()
        runner = StackRunner(opts, children, NO_INFRA, out=io.StringIO(), err=err)
        assert runner.run() == 1
    owner = "kvmeta gRPC" if holder == "child" else "redis embedded"
    assert f"port already in use: {owner} port 127.0.0.1:{port}" in err.getvalue()
    assert runner.supervisor.children == ()
    assert read_state(tmp_path) is None


def test_duplicate_configured_ports_are_refused(tmp_path: Path, standin: Path) -> None:
    port = free_port()
    children = [spec(standin, tmp_path, "a", port), spec(standin, tmp_path, "b", port)]
    err = io.StringIO()
    runner = StackRunner(options(tmp_path), children, NO_INFRA, out=io.StringIO(), err=err)
    assert runner.run() == 1
    assert (
        f"port conflict: b gRPC port 127.0.0.1:{port} is also configured for a gRPC"
        in err.getvalue()
    )
    assert runner.supervisor.children == ()


def test_up_refuses_while_a_recorded_process_runs(
    tmp_path: Path, no_leftovers: list[ProcRef]
) -> None:
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    ref = ProcRef.of("kvmeta", sleeper.pid)
    no_leftovers.append(ref)
    write_state(
        tmp_path,
        StackState(
            up=ProcEntry("up", 999_999_999, None, kind="up"),
            state_dir=str(tmp_path),
            processes=[ProcEntry("kvmeta", ref.pid, ref.create_time, kind="service")],
        ),
    )
    err = io.StringIO()
    assert StackRunner(options(tmp_path), [], NO_INFRA, out=io.StringIO(), err=err).run() == 1
    assert "still running (kvmeta); run `tideserve down` first" in err.getvalue()
    result = stack_down(tmp_path, stop_timeout_s=2.0)
    sleeper.wait(5)
    assert result.was_running and not result.signalled_up
    assert result.killed == () and result.still_alive == ()  # SIGTERM was enough
    assert result.orphans == ("kvmeta",)
    assert read_state(tmp_path) is None


def test_down_signals_up_and_waits(tmp_path: Path, no_leftovers: list[ProcRef]) -> None:
    # a stand-in `up`: on SIGTERM it stops its own child, then exits
    script = (
        "import signal, subprocess, sys, time\n"
        "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "def stop(*_):\n    c.terminate(); c.wait(); sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, stop)\n"
        # the pid only once the handler is in place: a SIGTERM sent on reading it must
        # find the handler (else this stand-in dies at once and orphans its child)
        "print(c.pid, flush=True)\n"
        "while True: time.sleep(0.1)\n"
    )
    up = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert up.stdout is not None
    child_pid = int(up.stdout.readline())
    up_ref, child_ref = ProcRef.of("up", up.pid), ProcRef.of("svc", child_pid)
    no_leftovers.extend([up_ref, child_ref])
    write_state(
        tmp_path,
        StackState(
            up=ProcEntry("up", up.pid, up_ref.create_time, kind="up"),
            state_dir=str(tmp_path),
            phase="running",
            processes=[ProcEntry("svc", child_pid, child_ref.create_time, kind="service")],
        ),
    )
    result = stack_down(
        tmp_path, up_timeout_s=20.0, sleep=lambda s: (up.poll(), time.sleep(s)) and None
    )
    assert result.was_running and result.signalled_up
    assert result.killed == () and result.still_alive == ()
    assert not is_alive(child_ref)
    assert read_state(tmp_path) is None
    assert stack_down(tmp_path).was_running is False  # nothing running: a no-op


def test_stop_signal_during_start_stops_what_was_started(
    tmp_path: Path, standin: Path, no_leftovers: list[ProcRef]
) -> None:
    children = [spec(standin, tmp_path, "svc0", free_port(), "not-serving")]
    err = io.StringIO()
    runner = StackRunner(options(tmp_path), children, NO_INFRA, out=io.StringIO(), err=err)

    def stopper() -> None:  # SIGTERM once the child is recorded (start-up still waiting)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            st = read_state(tmp_path)
            if st is not None and st.processes:
                os.kill(os.getpid(), signal.SIGTERM)
                return
            time.sleep(0.05)

    t = threading.Thread(target=stopper)
    t.start()
    rc = runner.run()
    t.join()
    no_leftovers.extend(c.ref for c in runner.supervisor.children)
    assert rc == 0
    assert "SIGTERM received before the stack was ready; stopping" in err.getvalue()
    assert not any(is_alive(c.ref) for c in runner.supervisor.children)
    assert read_state(tmp_path) is None


@pytest.mark.parametrize("which", ["postgres", "redis"])
def test_unreachable_external_server_fails_before_any_child(
    tmp_path: Path, standin: Path, which: str
) -> None:
    def unreachable(url: str) -> None:
        raise ConnectionError(f"cannot reach {which} at {url}: connection refused")

    infra = dataclasses.replace(NO_INFRA, **{f"check_{which}": unreachable})
    children = [spec(standin, tmp_path, "svc0", free_port())]
    err = io.StringIO()
    runner = StackRunner(options(tmp_path), children, infra, out=io.StringIO(), err=err)
    assert runner.run() == 1
    label = "PostgreSQL" if which == "postgres" else "Redis"
    assert f"external {label} failed: cannot reach {which}" in err.getvalue()
    assert runner.supervisor.children == ()
    assert read_state(tmp_path) is None


def test_http_and_plain_children_join_the_stack(
    tmp_path: Path, standin: Path, no_leftovers: list[ProcRef]
) -> None:
    """Non-gRPC children (future engines): ready on HTTP 2xx, or as soon as they run."""
    port = free_port()
    web = tmp_path / "web"
    web.mkdir()
    children = [
        spec(standin, tmp_path, "svc0", free_port()),
        ChildSpec(
            "engine-0",
            (sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "-d", str(web)),
            dict(os.environ),
            tmp_path / "logs" / "engine-0.log",
            ready_url=f"http://127.0.0.1:{port}/",
            ports=(PortClaim("engine-0", "HTTP", "127.0.0.1", port, "port", "/"),),
            kind="engine",
        ),
        ChildSpec(
            "sidecar",
            (sys.executable, "-c", "import time; time.sleep(60)"),
            dict(os.environ),
            tmp_path / "logs" / "sidecar.log",
            kind="engine",
        ),
    ]
    out, err = io.StringIO(), io.StringIO()
    runner = StackRunner(options(tmp_path), children, NO_INFRA, out=out, err=err)
    rc, seen = run(runner, stop_when_running=True)
    no_leftovers.extend(c.ref for c in runner.supervisor.children)
    assert rc == 0, err.getvalue()
    assert f"engine-0 is SERVING on http://127.0.0.1:{port}/" in err.getvalue()
    assert {p.name: p.kind for p in seen} == {
        "svc0": "service",
        "engine-0": "engine",
        "sidecar": "engine",
    }
    assert not any(is_alive(c.ref) for c in runner.supervisor.children)


def test_engine_dying_is_reported_and_the_stack_keeps_running(
    tmp_path: Path, standin: Path, no_leftovers: list[ProcRef]
) -> None:
    """An engine is data plane: the gateway routes around a dead one, so `up` goes on."""
    children = [
        dataclasses.replace(spec(standin, tmp_path, "engine-1", free_port(), "die-later"),
                            kind="engine"),
        spec(standin, tmp_path, "svc0", free_port()),
    ]  # fmt: skip
    err = io.StringIO()
    runner = StackRunner(options(tmp_path), children, NO_INFRA, out=io.StringIO(), err=err)

    def stopper() -> None:  # SIGTERM only once the engine's death has been reported
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and "keeps running" not in err.getvalue():
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)

    t = threading.Thread(target=stopper)
    t.start()
    rc = runner.run()
    t.join()
    no_leftovers.extend(c.ref for c in runner.supervisor.children)
    assert rc == 0, err.getvalue()
    assert (
        "engine-1 exited with code 4: stand-in: dying" in err.getvalue()
        and "the stack keeps running without it" in err.getvalue()
    )
    assert err.getvalue().count("engine-1 exited") == 1  # reported once
    assert "stop requested; stopping" in err.getvalue()


@pytest.mark.parametrize(
    ("modes", "rc", "needle"),
    [
        (("serving", "die-later"), 0, "the stack keeps running without it"),
        (("die-later:3", "die-later"), 1, "scheduler.log); stopping the stack"),
    ],
    ids=["one-of-two-dies-keeps-running", "last-replica-dying-stops-the-stack"],
)
def test_gateway_replica_dying(
    tmp_path: Path,
    standin: Path,
    no_leftovers: list[ProcRef],
    modes: tuple[str, str],
    rc: int,
    needle: str,
) -> None:
    """Gateway replicas (replica_of "scheduler"): losing one while another runs is reported
    like an engine; losing the last one is fatal, as for any service."""
    children = [
        dataclasses.replace(spec(standin, tmp_path, name, free_port(), mode),
                            replica_of="scheduler")
        for name, mode in zip(("scheduler", "scheduler-2"), modes, strict=True)
    ]  # fmt: skip
    err = io.StringIO()
    runner = StackRunner(options(tmp_path), children, NO_INFRA, out=io.StringIO(), err=err)

    def stopper() -> None:  # SIGTERM once the death is reported (unless `up` stopped itself)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and needle not in err.getvalue():
            time.sleep(0.05)
        if rc == 0:
            os.kill(os.getpid(), signal.SIGTERM)

    t = threading.Thread(target=stopper)
    t.start()
    code = runner.run()
    t.join()
    no_leftovers.extend(c.ref for c in runner.supervisor.children)
    assert code == rc, err.getvalue()
    assert needle in err.getvalue()
    # scheduler-2 dies first, while scheduler runs: reported once, the stack goes on
    assert err.getvalue().count("scheduler-2 exited with code 4: stand-in: dying") == 1
    assert "scheduler-2.log); the stack keeps running without it" in err.getvalue()
    assert ("stop requested; stopping" in err.getvalue()) == (rc == 0)
    assert read_state(tmp_path) is None  # everything stopped either way
