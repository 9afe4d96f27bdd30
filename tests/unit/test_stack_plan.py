"""Pure parts of the local stack: ports, children, stop order, state file, reports."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.common.local.procs import ProcRef
from services.common.local.state import (
    ProcEntry,
    StackState,
    read_state,
    redact_url,
    remove_state,
    write_state,
)
from services.stack.control import ServiceStatus, all_serving, stop_order
from services.stack.plan import (
    SERVICE_NAMES,
    PortClaim,
    build_service_children,
    choose_ports,
    duplicate_ports,
)


@pytest.mark.parametrize(
    ("configured", "offset", "service", "expected"),
    [
        ({}, 0, "scheduler", {"grpc_port": 50051, "metrics_port": 9101, "http_port": 8000}),
        ({}, 0, "telemetry", {"grpc_port": 50054, "metrics_port": 9104}),
        ({}, 100, "kvmeta", {"grpc_port": 50152, "metrics_port": 9202, "metadata_http_port": 8181}),
        (
            {"autoscaler": {"grpc_port": 6000}},
            0,
            "autoscaler",
            {"grpc_port": 6000, "metrics_port": 9103},
        ),
        (
            {"autoscaler": {"metrics_port": 0}},
            7,
            "autoscaler",
            {"grpc_port": 50060, "metrics_port": 0},
        ),
    ],
    ids=["defaults", "no-extra-ports", "offset-everything", "configured", "metrics-off-stays-off"],
)
def test_choose_ports(
    configured: dict[str, dict[str, int]], offset: int, service: str, expected: dict[str, int]
) -> None:
    assert choose_ports(configured, offset)[service] == expected


@pytest.mark.parametrize(
    ("configured", "offset", "needle"),
    [
        ({}, 20000, "scheduler.grpc_port"),
        ({"kvmeta": {"grpc_port": 0}}, 0, "kvmeta.grpc_port"),
    ],
    ids=["offset-overflows", "grpc-port-zero"],
)
def test_choose_ports_rejects(
    configured: dict[str, dict[str, int]], offset: int, needle: str
) -> None:
    with pytest.raises(ValueError, match=needle):
        choose_ports(configured, offset)


def test_duplicate_ports_names_both_claimants() -> None:
    claims = [
        PortClaim("redis", "embedded", "127.0.0.1", 7000),
        PortClaim("kvmeta", "gRPC", "127.0.0.1", 7001),
        PortClaim("telemetry", "metrics", "127.0.0.1", 7000),
    ]
    [(first, second)] = duplicate_ports(claims)
    assert (first.owner, second.owner) == ("redis", "telemetry")
    assert duplicate_ports(claims[:2]) == []


def test_service_children(tmp_path: Path) -> None:
    children = build_service_children(
        ports=choose_ports({}, 10),
        host="127.0.0.1",
        state_dir=tmp_path,
        config_path="/etc/ts.yaml",
        base_env={"PATH": "/bin", "TIDESERVE_GRPC_PORT": "1"},
        python="/py",
    )
    assert [c.name for c in children] == list(SERVICE_NAMES)
    kv = children[1]
    assert kv.argv == (
        "/py",
        "-m",
        "services.kvmeta",
        "--grpc-port",
        "50062",
        "--config",
        "/etc/ts.yaml",
    )
    assert kv.grpc_address == "127.0.0.1:50062"
    assert kv.grpc_service == "tideserve.v1.KVMetaService"
    assert kv.log_path == tmp_path / "logs" / "kvmeta.log"
    assert kv.env["TIDESERVE_GRPC_PORT"] == "50062"
    assert kv.env["TIDESERVE_METRICS_PORT"] == "9112"
    assert kv.env["TIDESERVE_METADATA_HTTP_PORT"] == "8091"
    assert kv.env["TIDESERVE_CONFIG"] == "/etc/ts.yaml"
    assert kv.env["PATH"] == "/bin"
    assert "TIDESERVE_POSTGRES_URL" not in kv.env  # added by `up` once known
    assert [(c.purpose, c.port, c.url()) for c in kv.ports] == [
        ("gRPC", 50062, None),
        ("metrics", 9112, "http://127.0.0.1:9112/metrics"),
        ("TE metadata", 8091, "http://127.0.0.1:8091/metadata"),
    ]


def test_stop_order_services_then_redis_then_postgres() -> None:
    refs = [
        ProcRef(n, i)
        for i, n in enumerate(["postgres", "kvmeta", "redis", "engine-0", "scheduler"])
    ]
    kinds = ["postgres", "service", "redis", "engine", "service"]
    waves = stop_order(refs, kinds)
    assert [[r.name for r in w] for w in waves] == [
        ["engine-0"],
        ["kvmeta", "scheduler"],
        ["redis"],
        ["postgres"],
    ]


def _status(health: str) -> ServiceStatus:
    return ServiceStatus("kvmeta", "127.0.0.1:1", 1, True, health, None)


@pytest.mark.parametrize(
    ("healths", "expected"),
    [
        (["SERVING", "SERVING"], True),
        (["SERVING", "NOT_SERVING"], False),
        (["UNREACHABLE"], False),
        ([], False),
    ],
    ids=["all-serving", "one-not-serving", "unreachable", "nothing"],
)
def test_all_serving(healths: list[str], expected: bool) -> None:
    assert all_serving([_status(h) for h in healths]) is expected


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("postgresql://u:secret@db:5432/ts", "postgresql://u:***@db:5432/ts"),
        ("redis://127.0.0.1:6380/0", "redis://127.0.0.1:6380/0"),
        (
            "postgresql://postgres@/postgres?host=/tmp/s",
            "postgresql://postgres@/postgres?host=/tmp/s",
        ),
        ("redis://:pw@h:1/0", "redis://:***@h:1/0"),
    ],
    ids=["password", "no-credentials", "user-only-socket", "password-only"],
)
def test_redact_url(url: str, expected: str) -> None:
    assert redact_url(url) == expected


def test_state_file_round_trip(tmp_path: Path) -> None:
    assert read_state(tmp_path) is None
    state = StackState(
        up=ProcEntry("up", 10, 1.5, kind="up"),
        state_dir=str(tmp_path),
        phase="running",
        processes=[
            ProcEntry("redis", 11, 2.0, kind="redis", url="redis://x"),
            ProcEntry(
                "kvmeta",
                12,
                3.0,
                kind="service",
                grpc_address="127.0.0.1:5",
                endpoints={"metrics": "http://m"},
            ),
        ],
    )
    write_state(tmp_path, state)
    back = read_state(tmp_path)
    assert back == state
    assert back is not None and [p.name for p in back.services()] == ["kvmeta"]
    remove_state(tmp_path)
    remove_state(tmp_path)  # idempotent
    assert read_state(tmp_path) is None


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("{not json", "not JSON"),
        ('{"version": 99}', "unsupported state version"),
        ('{"version": 1}', "malformed"),
    ],
    ids=["garbage", "future-version", "missing-keys"],
)
def test_bad_state_file_is_a_clear_error(tmp_path: Path, content: str, needle: str) -> None:
    (tmp_path / "stack.json").write_text(content)
    with pytest.raises(ValueError, match=needle):
        read_state(tmp_path)
