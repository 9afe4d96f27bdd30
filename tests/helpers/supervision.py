"""Stand-in children for the stack supervision tests (`tests/unit/test_stack_*`).

`STANDIN` is a tiny grpc.health.v1 server script run as a real child process; `spec` and
`options` build the `ChildSpec` / `UpOptions` for it (external database URLs, so no embedded
server starts and no migration runs); `run` drives a `StackRunner` in the main thread.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from services.common.local.spec import ChildSpec, PortClaim
from services.common.local.state import ProcEntry, read_state
from services.stack.up import Infra, StackRunner, UpOptions

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
