"""`tideserve probe`: target parsing (pure) and the verb against a real gRPC health server."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from services.cli import main
from services.stack.probe import ProbeTarget, parse_target


@pytest.mark.parametrize(
    ("target", "env", "want"),
    [
        ("10.0.0.1:50052", {}, ProbeTarget("grpc", "10.0.0.1:50052")),
        ("grpc://kvmeta:50052", {}, ProbeTarget("grpc", "kvmeta:50052")),
        ("http://e:30001/health", {}, ProbeTarget("http", "http://e:30001/health")),
        (None, {"TIDESERVE_PROBE": "http://x/h"}, ProbeTarget("http", "http://x/h")),
        (None, {"TIDESERVE_GRPC_PORT": "50053"}, ProbeTarget("grpc", "127.0.0.1:50053")),
        (None, {}, ProbeTarget("grpc", "127.0.0.1:50051")),
    ],
    ids=["host-port", "grpc-scheme", "http", "env-probe", "env-grpc-port", "scheduler-default"],
)
def test_parse_target(target: str | None, env: dict[str, str], want: ProbeTarget) -> None:
    assert parse_target(target, env) == want


@pytest.mark.parametrize(
    ("target", "env", "message"),
    [
        ("kvmeta", {}, "expected HOST:PORT"),
        ("kvmeta:0", {}, "expected HOST:PORT"),
        ("kvmeta:http", {}, "expected HOST:PORT"),
    ],
    ids=["no-port", "port-zero", "port-not-number"],
)
def test_parse_target_rejects(target: str | None, env: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_target(target, env)


@pytest.fixture
def health_server() -> Iterator[tuple[str, health.HealthServicer]]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}", servicer
    finally:
        server.stop(None)


@pytest.mark.parametrize(
    ("status", "code"),
    [(health_pb2.HealthCheckResponse.SERVING, 0), (health_pb2.HealthCheckResponse.NOT_SERVING, 1)],
    ids=["serving", "not-serving"],
)
def test_probe_exit_code_follows_health(
    health_server: tuple[str, health.HealthServicer], status: int, code: int
) -> None:
    address, servicer = health_server
    servicer.set("", status)
    assert main(["probe", address]) == code


def test_probe_unknown_service_is_unhealthy(
    health_server: tuple[str, health.HealthServicer], capsys: pytest.CaptureFixture[str]
) -> None:
    address, servicer = health_server
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    assert main(["probe", address, "--service", "tideserve.v1.Nope"]) == 1
    assert "SERVICE_UNKNOWN" in capsys.readouterr().out


def test_probe_bad_target_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["probe", "no-port-here"]) == 2
    assert "expected HOST:PORT" in capsys.readouterr().out
