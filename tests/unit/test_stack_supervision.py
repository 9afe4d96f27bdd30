"""Supervision with real child processes: tiny grpc health servers stand in for services.

The runner under test (`StackRunner`) is the real one; the stand-ins are real processes that
really serve grpc.health.v1, so readiness, failure and stop paths are exercised for real.
External database URLs are given so no embedded server starts and no migration runs here
(the e2e test covers those).
"""

from __future__ import annotations

import dataclasses
import http.server
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

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from services.stack.control import stack_down
from services.stack.health import Health, check_grpc_health, check_http_ready
from services.stack.plan import ChildSpec, PortClaim
from services.stack.ports import port_is_free
from services.stack.procs import ProcRef, Supervisor, is_alive, stop_processes
from services.stack.state import ProcEntry, StackState, read_state, write_state
from services.stack.up import Infra, StackRunner, UpOptions
from tests.helpers.ports import free_port

STANDIN = r"""
import signal, sys, time
from concurrent import futures
import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
port, mode = int(sys.argv[1]), sys.argv[2]
if mode == "exit3":
    print("stand-in: configured to fail", flush=True)
    sys.exit(3)
server = grpc.server(futures.ThreadPoolExecutor(2))
h = health.HealthServicer()
health_pb2_grpc.add_HealthServicer_to_server(h, server)
server.add_insecure_port(f"127.0.0.1:{port}")
server.start()
status = health_pb2.HealthCheckResponse.NOT_SERVING if mode == "not-serving" else health_pb2.HealthCheckResponse.SERVING
h.set("", status)
def stop(*_):
    server.stop(0)
    sys.exit(0)
signal.signal(signal.SIGTERM, signal.SIG_IGN if mode == "ignore-term" else stop)
t0 = time.monotonic()
while True:
    time.sleep(0.1)
    if mode.startswith("die-later") and time.monotonic() - t0 > float((mode + ":1").split(":")[1]):
        print("stand-in: dying", flush=True)
        sys.exit(4)
"""

NO_INFRA = Infra(
    start_postgres=lambda d: pytest.fail("no embedded postgres expected"),
    start_redis=lambda d, p: pytest.fail("no embedded redis expected"),
    migrate=lambda u, s: pytest.fail("no migration expected"),
)


@pytest.fixture
def standin(tmp_path: Path) -> Path:
    path = tmp_path / "standin.py"
    path.write_text(STANDIN)
    return path


def spec(standin: Path, state: Path, name: str, port: int, mode: str = "serving") -> ChildSpec:
    return ChildSpec(
        name=name,
        argv=(sys.executable, str(standin), str(port), mode),
        env=dict(os.environ),
        log_path=state / "logs" / f"{name}.log",
        grpc_address=f"127.0.0.1:{port}",
        ports=(PortClaim(name, "gRPC", "127.0.0.1", port, "grpc_port"),),
    )


def options(state: Path, **kw: object) -> UpOptions:
    base: dict[str, object] = dict(
        state_dir=state,
        postgres_url="postgresql://u:pw@db.invalid/x",
        redis_url="redis://db.invalid:1/0",
        migrate_services=(),
        start_timeout_s=60.0,
        stop_timeout_s=3.0,
    )
    base.update(kw)
    return UpOptions(**base)  # type: ignore[arg-type]


def run(runner: StackRunner, *, stop_when_running: bool) -> tuple[int, list[ProcEntry]]:
    """Run in the main thread; a helper thread SIGTERMs us once the state says running and
    remembers the recorded processes."""
    seen: list[ProcEntry] = []
    done = threading.Event()

    def stopper() -> None:
        while not done.is_set():
            try:
                st = read_state(runner.opts.state_dir)
            except ValueError:
                st = None
            if st is not None and st.phase == "running":
                seen.extend(st.processes)
                if stop_when_running:
                    os.kill(os.getpid(), signal.SIGTERM)
                return
            time.sleep(0.05)

    t = threading.Thread(target=stopper)
    t.start()
    try:
        rc = runner.run()
    finally:
        done.set()
        t.join()
    return rc, seen


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
        "print(c.pid, flush=True)\n"
        "def stop(*_):\n    c.terminate(); c.wait(); sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, stop)\n"
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


def test_stop_processes_kills_what_ignores_sigterm() -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(1, flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
    )
    assert proc.stdout is not None
    proc.stdout.readline()  # handler installed
    ref = ProcRef.of("stubborn", proc.pid)
    assert stop_processes([ref], 0.5) == [ref]
    proc.wait(5)
    assert not is_alive(ref)
    assert stop_processes([ref], 0.5) == []  # idempotent


def test_recycled_pid_is_not_ours() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        real = ProcRef.of("x", proc.pid)
        assert real.create_time is not None
        impostor = ProcRef("x", proc.pid, real.create_time - 1000.0)
        assert is_alive(real) and not is_alive(impostor)
        assert stop_processes([impostor], 0.5) == []
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait()


def test_supervisor_writes_child_output_to_its_log(tmp_path: Path) -> None:
    sup = Supervisor(stop_timeout_s=1.0)
    child = sup.start(
        ChildSpec(
            "echo",
            (sys.executable, "-c", "import sys; print('hi'); print('oops', file=sys.stderr)"),
            dict(os.environ),
            tmp_path / "logs" / "echo.log",
        )
    )
    child.popen.wait(10)
    assert sup.exited() == [(child, 0)]
    assert (tmp_path / "logs" / "echo.log").read_text().split() == ["hi", "oops"]


class _Server:
    def __init__(self, status: int) -> None:
        from concurrent import futures

        self.server = grpc.server(futures.ThreadPoolExecutor(2))
        self.health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()
        self.health.set("", status)
        self.health.set("tideserve.v1.KVMetaService", status)


@pytest.mark.parametrize(
    ("status", "service", "expected"),
    [
        (health_pb2.HealthCheckResponse.SERVING, "", Health.SERVING),
        (health_pb2.HealthCheckResponse.SERVING, "tideserve.v1.KVMetaService", Health.SERVING),
        (health_pb2.HealthCheckResponse.NOT_SERVING, "", Health.NOT_SERVING),
        (health_pb2.HealthCheckResponse.SERVING, "tideserve.v1.Nope", Health.SERVICE_UNKNOWN),
    ],
    ids=["serving", "named-service", "not-serving", "unknown-service"],
)
def test_check_grpc_health(status: int, service: str, expected: Health) -> None:
    srv = _Server(status)
    try:
        assert check_grpc_health(f"127.0.0.1:{srv.port}", service, 5.0) is expected
    finally:
        srv.server.stop(0)


def test_check_grpc_health_unreachable() -> None:
    assert check_grpc_health(f"127.0.0.1:{free_port()}", "", 0.5) is Health.UNREACHABLE


def test_port_is_free() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.listen(1)
        assert not port_is_free("127.0.0.1", port)
    assert port_is_free("127.0.0.1", port)


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


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/ok" else 503)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.parametrize(
    ("path", "expected"),
    [("/ok", Health.SERVING), ("/busy", Health.NOT_SERVING)],
    ids=["2xx", "503"],
)
def test_check_http_ready(path: str, expected: Health) -> None:
    server = http.server.HTTPServer(("127.0.0.1", 0), _Handler)
    t = threading.Thread(target=server.serve_forever)
    t.start()
    try:
        assert check_http_ready(f"http://127.0.0.1:{server.server_port}{path}", 5.0) is expected
    finally:
        server.shutdown()
        server.server_close()
        t.join()


def test_check_http_ready_unreachable() -> None:
    assert check_http_ready(f"http://127.0.0.1:{free_port()}/", 0.5) is Health.UNREACHABLE


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


ORDER_PROBE = r"""
import signal, sys, time
peer_log = sys.argv[1] if len(sys.argv) > 1 else ""
def stop(*_):
    if peer_log:  # an engine: give a service stopped at the same time the chance to log it
        time.sleep(0.5)
        with open(peer_log) as fh:
            print(f"stopping; service stopped before me: {'stopped' in fh.read()}", flush=True)
    else:
        print("stopped", flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
print("ready", flush=True)
while True:
    time.sleep(0.05)
"""


def test_supervisor_stops_engines_before_services(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(ORDER_PROBE)
    sup = Supervisor(stop_timeout_s=5.0)
    service = sup.start(
        ChildSpec("svc", (sys.executable, str(probe)), dict(os.environ), tmp_path / "svc.log")
    )
    engine = sup.start(
        ChildSpec(
            "engine-1",
            (sys.executable, str(probe), str(tmp_path / "svc.log")),
            dict(os.environ),
            tmp_path / "engine-1.log",
            kind="engine",
        )
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not all(
        "ready" in (tmp_path / n).read_text() for n in ("svc.log", "engine-1.log")
    ):
        time.sleep(0.05)
    assert sup.stop_all() == []
    assert "service stopped before me: False" in (tmp_path / "engine-1.log").read_text()
    assert "stopped" in (tmp_path / "svc.log").read_text()  # then the service
    assert not is_alive(engine.ref) and not is_alive(service.ref)


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
