"""Each service as its own process: health SERVING, reflection, exit 0 on SIGTERM; startup
failures exit 2 with exactly one stderr line naming the setting."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from tests.helpers.ports import free_port

SERVING = health_pb2.HealthCheckResponse.SERVING
NO_PORTS = ["--grpc-port", "0", "--metrics-port", "0"]  # never the design's default ports
START_TIMEOUT_S = 60.0  # generous: two cores shared by many test workers

SERVICES = [
    ("scheduler", "tideserve.v1.SchedulerService"),
    ("kvmeta", "tideserve.v1.KVMetaService"),
    ("autoscaler", "tideserve.v1.AutoscalerService"),
    ("telemetry", "tideserve.v1.TelemetryService"),
]


def clean_env(**extra: str) -> dict[str, str]:
    """The outer environment without TIDESERVE_*, and every extra listener (gateway HTTP,
    TE metadata HTTP) off: tests never bind the design's default ports."""
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("TIDESERVE_")}
    env.update({"TIDESERVE_HTTP_PORT": "0", "TIDESERVE_METADATA_HTTP_PORT": "0"})
    env.update(extra)
    return env


class Proc:
    def __init__(self, popen: subprocess.Popen[bytes], stderr: Path) -> None:
        self.popen = popen
        self.stderr_path = stderr

    def stderr_lines(self) -> list[str]:
        return self.stderr_path.read_text(encoding="utf-8").splitlines()


@contextmanager
def service_process(
    tmp_path: Path, service: str, args: list[str], env: dict[str, str] | None = None
) -> Iterator[Proc]:
    stderr = tmp_path / f"{service}.stderr"
    with stderr.open("wb") as err, open(os.devnull, "wb") as out:
        popen = subprocess.Popen(
            [sys.executable, "-m", f"services.{service}", *args],
            cwd=tmp_path,
            env=env if env is not None else clean_env(),
            stdout=out,
            stderr=err,
        )
    proc = Proc(popen, stderr)
    try:
        yield proc
    finally:
        if popen.poll() is None:
            popen.kill()
        popen.wait(timeout=30)


def run_to_exit(tmp_path: Path, service: str, args: list[str], env: dict[str, str]) -> Proc:
    with service_process(tmp_path, service, args, env) as proc:
        proc.popen.wait(timeout=START_TIMEOUT_S)
    return proc


def wait_serving(port: int, name: str, proc: Proc) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            assert proc.popen.poll() is None, f"exited early: {proc.stderr_lines()}"
            try:
                response = stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=2)
                if response.status == SERVING:
                    return
            except grpc.RpcError:
                pass
            assert time.monotonic() < deadline, f"not SERVING: {proc.stderr_lines()}"
            time.sleep(0.1)


def reflected_services(port: int) -> set[str]:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="*")
        names: set[str] = set()
        for response in stub.ServerReflectionInfo(iter([request]), timeout=10):
            names.update(s.name for s in response.list_services_response.service)
        return names


@pytest.mark.parametrize(("service", "full_name"), SERVICES, ids=[s for s, _ in SERVICES])
def test_service_serves_and_stops_on_sigterm(tmp_path: Path, service: str, full_name: str) -> None:
    port = free_port()
    args = ["--grpc-port", str(port), "--metrics-port", "0"]
    with service_process(tmp_path, service, args) as proc:
        wait_serving(port, "", proc)
        wait_serving(port, full_name, proc)
        assert full_name in reflected_services(port)
        proc.popen.send_signal(signal.SIGTERM)
        assert proc.popen.wait(timeout=START_TIMEOUT_S) == 0
    entries = [json.loads(line) for line in proc.stderr_lines()]  # every line is JSON
    runner = [e["msg"] for e in entries if e["logger"] == "services.common.server"]
    assert runner == ["serving", "shutting down", "stopped"]
    assert {e["service"] for e in entries} == {service}


def closed_port() -> int:
    return free_port()  # nothing listens there once the probe socket is closed


BAD_SETTINGS = [
    (["--grpc-port", "abc"], {}, None, "invalid setting kvmeta.grpc_port (from command line)"),
    ([], {"TIDESERVE_KVMETA__LOG_LEVEL": "LOUD"}, None, "invalid setting kvmeta.log_level"),
    (
        [],
        {"TIDESERVE_SHUTDOWN_GRACE_S": "-1"},
        None,
        "invalid setting kvmeta.shutdown_grace_s (from env TIDESERVE_SHUTDOWN_GRACE_S)",
    ),
    (["--config", "conf.yaml"], {}, "grpc_port: [1\n", "invalid setting config: conf.yaml"),
    (["--config", "missing.yaml"], {}, None, "invalid setting config: cannot read missing.yaml"),
    (
        ["--config", "conf.yaml"],
        {},
        "kvmeta:\n  shutdown_grace_s: soon\n",
        "invalid setting kvmeta.shutdown_grace_s (from conf.yaml [kvmeta])",
    ),
]


@pytest.mark.parametrize(
    ("args", "env", "config", "expected"),
    BAD_SETTINGS,
    ids=[
        "flag-not-int",
        "env-bad-level",
        "env-negative-grace",
        "yaml-syntax",
        "no-file",
        "section",
    ],
)
def test_bad_settings_exit_2_with_one_line(
    tmp_path: Path, args: list[str], env: dict[str, str], config: str | None, expected: str
) -> None:
    if config is not None:
        (tmp_path / "conf.yaml").write_text(config, encoding="utf-8")
    proc = run_to_exit(tmp_path, "kvmeta", [*NO_PORTS, *args], clean_env(**env))
    lines = proc.stderr_lines()
    assert proc.popen.returncode == 2
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"tideserve-kvmeta: {expected}"), lines[0]


def test_port_in_use_exit_2_names_service_and_port(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = int(holder.getsockname()[1])
        args = ["--grpc-port", str(port), "--metrics-port", "0"]
        proc = run_to_exit(tmp_path, "autoscaler", args, clean_env())
    lines = proc.stderr_lines()
    assert proc.popen.returncode == 2
    assert lines == [
        f"tideserve-autoscaler: grpc_port 127.0.0.1:{port} is already in use (service autoscaler)"
    ]


def test_unreachable_redis_exit_2(tmp_path: Path) -> None:
    url = f"redis://127.0.0.1:{closed_port()}/0"
    proc = run_to_exit(tmp_path, "telemetry", ["--redis-url", url, *NO_PORTS], clean_env())
    lines = proc.stderr_lines()
    assert proc.popen.returncode == 2
    assert len(lines) == 1, lines
    assert lines[0].startswith("tideserve-telemetry: ")
    assert "redis_url" in lines[0]


def test_unreachable_postgres_exit_2_hides_password(tmp_path: Path) -> None:
    url = f"postgresql://ts:s3cret@127.0.0.1:{closed_port()}/ts"
    args = ["--postgres-url", url, *NO_PORTS]
    proc = run_to_exit(tmp_path, "kvmeta", args, clean_env())
    lines = proc.stderr_lines()
    assert proc.popen.returncode == 2
    assert len(lines) == 1, lines
    assert lines[0].startswith("tideserve-kvmeta: ")
    assert "postgres_url" in lines[0]
    assert "s3cret" not in lines[0]


def test_with_real_postgres_and_redis_migrates_and_serves(
    tmp_path: Path, postgres_db_url: str, redis_url: str
) -> None:
    import psycopg

    port = free_port()
    args = [
        *("--grpc-port", str(port), "--metrics-port", "0"),
        *("--postgres-url", postgres_db_url, "--redis-url", redis_url),
    ]
    with service_process(tmp_path, "kvmeta", args) as proc:
        wait_serving(port, "tideserve.v1.KVMetaService", proc)
        proc.popen.send_signal(signal.SIGTERM)
        assert proc.popen.wait(timeout=START_TIMEOUT_S) == 0
    plain = postgres_db_url.replace("postgresql+psycopg://", "postgresql://", 1)
    with psycopg.connect(plain) as conn:
        row = conn.execute(
            "SELECT count(*) FROM information_schema.schemata WHERE schema_name = 'kvmeta'"
        ).fetchone()
    assert row == (1,)
