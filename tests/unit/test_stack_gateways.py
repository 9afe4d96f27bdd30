"""Gateway replicas in the local stack (``tideserve up --gateways N``): port plan, children,
the shared HTTP port claim, and duplicate/busy port detection around it. Pure except the
one bind probe."""

from __future__ import annotations

import argparse
import os
import socket
from pathlib import Path

import pytest
from pydantic import ValidationError

from services.common.local.ports import busy_ports
from services.common.local.spec import ChildSpec, PortClaim
from services.stack.cli import register, resolve_up
from services.stack.gateways import (
    MAX_GATEWAYS,
    GatewayCount,
    GatewayReplicas,
    gateway_count,
    parse_gateway_count,
    replica_names,
    replica_ports,
)
from services.stack.plan import (
    build_service_children,
    choose_ports,
    duplicate_ports,
)
from services.stack.settings import StackSettings

BASE = {"grpc_port": 50051, "metrics_port": 9101, "http_port": 8000}


@pytest.mark.parametrize(
    ("base", "gw", "expected"),
    [
        (BASE, GatewayReplicas(1), [BASE]),
        (
            BASE,
            GatewayReplicas(3),
            [
                BASE,
                {"grpc_port": 50151, "metrics_port": 9201, "http_port": 8000},
                {"grpc_port": 50251, "metrics_port": 9301, "http_port": 8000},
            ],
        ),
        (
            {"grpc_port": 50061, "metrics_port": 0, "http_port": 8010},
            GatewayReplicas(2),
            [
                {"grpc_port": 50061, "metrics_port": 0, "http_port": 8010},
                {"grpc_port": 50161, "metrics_port": 0, "http_port": 8010},
            ],
        ),
        (
            BASE,
            GatewayReplicas(3, port_step=7, grpc_ports=(4001, 4000)),
            [
                BASE,
                {"grpc_port": 4001, "metrics_port": 9108, "http_port": 8000},
                {"grpc_port": 4000, "metrics_port": 9115, "http_port": 8000},
            ],
        ),
        (
            {"grpc_port": 50051, "metrics_port": 9101, "http_port": 0},
            GatewayReplicas(2),
            [
                {"grpc_port": 50051, "metrics_port": 9101, "http_port": 0},
                {"grpc_port": 50151, "metrics_port": 9201, "http_port": 0},
            ],
        ),
    ],
    ids=["one-is-the-scheduler", "three-step-100", "metrics-off-stays-off",
         "explicit-grpc-and-step", "gateway-off"],
)  # fmt: skip
def test_replica_ports(
    base: dict[str, int], gw: GatewayReplicas, expected: list[dict[str, int]]
) -> None:
    assert replica_ports(base, gw) == expected


@pytest.mark.parametrize(
    ("gw", "needle"),
    [
        (GatewayReplicas(0), "--gateways 0: must be 1..16"),
        (GatewayReplicas(17), "--gateways 17"),
        (GatewayReplicas(3, grpc_ports=(4000,)), "lists 1 ports for 2 more"),
        (GatewayReplicas(2, port_step=0), "gateway_port_step 0"),
        (GatewayReplicas(2, port_step=20000), "scheduler-2 grpc_port 70051"),
    ],
    ids=["zero", "too-many", "too-few-explicit", "step-zero", "overflow"],
)
def test_replica_ports_refuses(gw: GatewayReplicas, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        replica_ports(BASE, gw)


def test_replica_names() -> None:
    assert replica_names(1) == ("scheduler",)
    assert replica_names(3) == ("scheduler", "scheduler-2", "scheduler-3")


def _children(tmp_path: Path, gw: GatewayReplicas | None, offset: int = 0) -> dict[str, ChildSpec]:
    children = build_service_children(
        ports=choose_ports({}, offset),
        host="127.0.0.1",
        state_dir=tmp_path,
        config_path=None,
        base_env={},
        python="py",
        gateways=gw,
    )
    return {c.name: c for c in children}


def test_one_gateway_is_exactly_the_plain_scheduler(tmp_path: Path) -> None:
    assert _children(tmp_path, GatewayReplicas(1)) == _children(tmp_path, None)
    sched = _children(tmp_path, None)["scheduler"]
    assert sched.replica_of == ""
    assert not any(c.shared for c in sched.ports)
    # no replica settings: only where telemetry is (every gateway prices TTFT with its fit)
    scheduler_keys = {k for k in sched.env if k.startswith("TIDESERVE_SCHEDULER__")}
    assert scheduler_keys == {"TIDESERVE_SCHEDULER__TELEMETRY_ADDRESS"}


def test_kvmeta_and_the_gateways_find_telemetry(tmp_path: Path) -> None:
    """kvmeta asks the stack's telemetry for its tool times (the predictor's priors)."""
    by_name = _children(tmp_path, GatewayReplicas(2), offset=5)
    kvmeta_keys = {k: v for k, v in by_name["kvmeta"].env.items() if "__TELEMETRY" in k}
    telemetry = by_name["scheduler-2"].env["TIDESERVE_SCHEDULER__TELEMETRY_ADDRESS"]
    assert kvmeta_keys == {"TIDESERVE_KVMETA__TELEMETRY_ADDRESS": telemetry}
    assert telemetry == "127.0.0.1:50059"


def test_replicas_share_the_http_port_and_state(tmp_path: Path) -> None:
    by_name = _children(tmp_path, GatewayReplicas(2), offset=5)
    assert list(by_name) == ["scheduler", "scheduler-2", "kvmeta", "autoscaler", "telemetry"]
    for name, grpc, metrics in (("scheduler", 50056, 9106), ("scheduler-2", 50156, 9206)):
        child = by_name[name]
        assert child.argv == ("py", "-m", "services.scheduler", "--grpc-port", str(grpc))
        assert child.grpc_address == f"127.0.0.1:{grpc}"
        assert child.log_path == tmp_path / "logs" / f"{name}.log"
        assert child.replica_of == "scheduler"
        env = child.env
        assert (env["TIDESERVE_GRPC_PORT"], env["TIDESERVE_METRICS_PORT"]) == (
            str(grpc),
            str(metrics),
        )
        assert env["TIDESERVE_HTTP_PORT"] == "8005"
        assert env["TIDESERVE_SCHEDULER__REPLICA_ID"] == name
        assert env["TIDESERVE_SCHEDULER__SHARE_STATE"] == "true"
        assert env["TIDESERVE_SCHEDULER__HTTP_REUSE_PORT"] == "true"
        claims = {c.setting: (c.owner, c.port, c.shared) for c in child.ports}
        assert claims == {
            "grpc_port": (name, grpc, False),
            "metrics_port": (name, metrics, False),
            "http_port": (name, 8005, True),
        }
    assert by_name["kvmeta"].replica_of == ""
    all_claims = [c for child in by_name.values() for c in child.ports]
    assert duplicate_ports(all_claims) == []


def test_a_replica_port_hitting_another_service_is_a_duplicate(tmp_path: Path) -> None:
    # step 1: scheduler-2's gRPC port is kvmeta's 50052, its metrics port kvmeta's 9102
    by_name = _children(tmp_path, GatewayReplicas(2, port_step=1))
    dups = duplicate_ports([c for child in by_name.values() for c in child.ports])
    assert {(a.owner, b.owner, b.port) for a, b in dups} == {
        ("scheduler-2", "kvmeta", 50052),
        ("scheduler-2", "kvmeta", 9102),
    }


def _claim(owner: str, port: int, setting: str, shared: bool, host: str = "h") -> PortClaim:
    return PortClaim(owner, setting, host, port, setting, shared=shared)


@pytest.mark.parametrize(
    ("claims", "conflicts"),
    [
        ([_claim("a", 1, "http_port", True), _claim("b", 1, "http_port", True),
          _claim("c", 1, "http_port", True)], []),
        ([_claim("a", 1, "http_port", True), _claim("b", 1, "http_port", False)], [("a", "b")]),
        ([_claim("a", 1, "http_port", False), _claim("b", 1, "http_port", True)], [("a", "b")]),
        ([_claim("a", 1, "http_port", True), _claim("b", 1, "metrics_port", True)], [("a", "b")]),
        ([_claim("a", 1, "http_port", True), _claim("b", 1, "http_port", True, "other")],
         [("a", "b")]),
        ([_claim("a", 1, "http_port", True), _claim("b", 1, "http_port", True),
          _claim("redis", 1, "", False)], [("a", "redis")]),
    ],
    ids=["all-shared", "shared-then-private", "private-then-shared", "different-setting",
         "different-host", "third-party-on-shared-port"],
)  # fmt: skip
def test_duplicate_ports_with_shared_claims(
    claims: list[PortClaim], conflicts: list[tuple[str, str]]
) -> None:
    assert [(a.owner, b.owner) for a, b in duplicate_ports(claims)] == conflicts


def test_busy_shared_port_is_reported_once() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        claims = [
            PortClaim(n, "gateway", "127.0.0.1", port, "http_port", "/v1", shared=True)
            for n in ("scheduler", "scheduler-2")
        ]
        assert [c.owner for c in busy_ports(claims)] == ["scheduler"]
    assert busy_ports(claims) == []


def _up_args(tmp_path: Path, *argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="verb"))
    return parser.parse_args(["up", "--state-dir", str(tmp_path), *argv])


@pytest.mark.parametrize(
    ("config", "argv", "names", "share"),
    [
        ("", ["--engines", "2"], ["scheduler", "scheduler-2"], "true"),
        ("", ["--engines", "2", "--gateways", "1"], ["scheduler"], None),
        ("", ["--engines", "2", "--gateways", "3"],
         ["scheduler", "scheduler-2", "scheduler-3"], "true"),
        ("stack:\n  gateways: 2\n", ["--engines", "1"], ["scheduler", "scheduler-2"], "true"),
        ("stack:\n  gateways: 3\n", ["--engines", "1", "--gateways", "2"],
         ["scheduler", "scheduler-2"], "true"),
        ("scheduler:\n  share_state: false\n", ["--engines", "1", "--gateways", "2"],
         ["scheduler", "scheduler-2"], "false"),
    ],
    ids=["default-one-per-core", "one", "flag", "config-file", "flag-wins",
         "explicit-share-state-kept"],
)  # fmt: skip
def test_up_gateways(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    config: str,
    argv: list[str],
    names: list[str],
    share: str | None,
) -> None:
    monkeypatch.chdir(tmp_path)  # no stray ./tideserve.yaml
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0, 1})  # two usable cores
    path = tmp_path / "ts.yaml"
    path.write_text(config)
    _, children = resolve_up(_up_args(tmp_path, "--config", str(path), *argv))
    replicas = [c for c in children if c.name.startswith("scheduler")]
    assert [c.name for c in replicas] == names
    # every replica is wired to membership: no static endpoints, the autoscaler's seed
    assert {c.env["TIDESERVE_SCHEDULER__ENDPOINTS"] for c in replicas} == {"[]"}
    assert {c.env["TIDESERVE_SCHEDULER__AUTOSCALER_ADDRESS"] for c in replicas} == {
        "127.0.0.1:50053"
    }
    assert {c.env.get("TIDESERVE_SCHEDULER__KVMETA_ADDRESS") for c in replicas} == {
        "127.0.0.1:50052"
    }
    assert {c.env.get("TIDESERVE_SCHEDULER__SHARE_STATE") for c in replicas} == {share}


def test_up_bad_gateways_is_one_line_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from services.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["up", "--state-dir", str(tmp_path / "st"), "--gateways", "0"]) == 2
    err = capsys.readouterr().err
    assert "gateways" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "st").exists()


@pytest.mark.parametrize(
    ("value", "cores", "count"),
    [("auto", 2, 2), ("auto", 1, 1), ("auto", 0, 1), ("auto", 64, MAX_GATEWAYS), (3, 2, 3)],
    ids=["auto-2-cores", "auto-1-core", "auto-unknown", "auto-capped", "explicit"],
)
def test_gateway_count_auto_is_one_per_core(value: GatewayCount, cores: int, count: int) -> None:
    assert gateway_count(value, cores) == count


@pytest.mark.parametrize(
    ("text", "value"), [("auto", "auto"), ("AUTO", "auto"), ("4", 4)], ids=["auto", "case", "int"]
)
def test_parse_gateway_count(text: str, value: GatewayCount) -> None:
    assert parse_gateway_count(text) == value


@pytest.mark.parametrize(
    ("given", "value"),
    [({}, "auto"), ({"gateways": 2}, 2), ({"gateways": "auto"}, "auto")],
    ids=["default-auto", "number", "auto"],
)
def test_stack_settings_gateways(given: dict[str, object], value: GatewayCount) -> None:
    assert StackSettings.model_validate(given).gateways == value


def test_stack_settings_refuse_a_bad_gateway_count() -> None:
    with pytest.raises(ValidationError):
        StackSettings.model_validate({"gateways": 0})
