"""Process handling and readiness checks under the stack runner, with real processes.

`stop_processes` / `is_alive` / `Supervisor` on real children, and the grpc.health.v1 and
HTTP readiness checks against real servers. The runner itself is in
`test_stack_supervision.py`.
"""

from __future__ import annotations

import http.server
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import psutil
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from services.common.local.ports import port_is_free
from services.common.local.procs import ProcRef, Supervisor, is_alive, stop_processes
from services.common.local.spec import ChildSpec
from services.stack.engines import stop_rank
from services.stack.health import Health, check_grpc_health, check_http_ready
from tests.helpers.ports import free_port


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


@pytest.mark.parametrize(
    ("btime_shift_s", "recorded", "alive"),
    [
        pytest.param(0.0, "boot", True, id="steady-clock"),
        pytest.param(5.0, "boot", True, id="clock-stepped-forward"),
        pytest.param(-3600.0, "boot", True, id="clock-stepped-back-an-hour"),
        pytest.param(0.0, "epoch", True, id="epoch-record-steady-clock"),
        pytest.param(0.4, "epoch", True, id="epoch-record-slewed"),
        pytest.param(5.0, "epoch", False, id="epoch-record-stepped"),
    ],
)
def test_a_process_stays_ours_when_the_wall_clock_moves(
    monkeypatch: pytest.MonkeyPatch, btime_shift_s: float, recorded: str, alive: bool
) -> None:
    """psutil's epoch create time is the start in ticks since boot plus the boot time, which
    follows the wall clock: a stepped or slewed clock moves it. Start times from boot do not
    move (an epoch record, from before them, allows a second)."""
    ref = ProcRef.of("me", os.getpid())
    assert ref.create_time is not None
    if recorded == "epoch":
        ref = ProcRef("me", ref.pid, psutil.Process(ref.pid).create_time())
    real = psutil._psplatform.boot_time  # type: ignore[attr-defined]
    monkeypatch.setattr(psutil._psplatform, "boot_time", lambda: real() + btime_shift_s)
    assert is_alive(ref) is alive


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
    """The stack's supervisor (``stop_rank`` of services.stack.engines) stops in waves."""
    probe = tmp_path / "probe.py"
    probe.write_text(ORDER_PROBE)
    sup = Supervisor(stop_timeout_s=5.0, stop_rank=stop_rank)
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
