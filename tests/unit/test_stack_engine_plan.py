"""Simulated engines in the local stack: planning, the deployment the autoscaler runs them
as, scheduler and autoscaler wiring, start/stop order, flags → options and children (pure;
no process is started)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from services.autoscaler.drivers.settings import DriverSettings
from services.autoscaler.settings import AutoscalerSettings
from services.common.local.spec import ChildSpec
from services.common.planner.spec import parse_spec
from services.scheduler.settings import SchedulerSettings
from services.stack.cli import register, resolve_up
from services.stack.deployment import autoscaler_driver_env, stack_deployment
from services.stack.engines import (
    ENGINE_KIND,
    EngineFleet,
    plan_engines,
    scheduler_engine_env,
    split_engine_args,
    start_waves,
    stop_rank,
    wire_scheduler,
)


@pytest.mark.parametrize(
    ("fleet", "expected"),
    [
        (EngineFleet(), []),
        (
            EngineFleet(workers=2),
            [("engine-1", "aggregated", 30001), ("engine-2", "aggregated", 30002)],
        ),
        (
            EngineFleet(prefill=1, decode=2, base_port=31001),
            [("prefill-1", "prefill", 31001), ("decode-1", "decode", 31002), ("decode-2", "decode", 31003)],
        ),
        (
            EngineFleet(workers=1, prefill=1, decode=1, ports=(5001, 5003, 5002)),
            [("engine-1", "aggregated", 5001), ("prefill-1", "prefill", 5003), ("decode-1", "decode", 5002)],
        ),
    ],
    ids=["none", "aggregated", "pd-from-base-port", "mixed-explicit-ports"],
)  # fmt: skip
def test_plan_engines(fleet: EngineFleet, expected: list[tuple[str, str, int]]) -> None:
    assert [(p.name, p.role, p.port) for p in plan_engines(fleet)] == expected


@pytest.mark.parametrize(
    ("fleet", "needle"),
    [
        (EngineFleet(prefill=1), "needs at least one of each"),
        (EngineFleet(decode=3), "needs at least one of each"),
        (EngineFleet(workers=-1), "--engines -1: must be 0 or more"),
        (EngineFleet(workers=3, ports=(1, 2)), "lists 2 ports for 3 engines"),
        (EngineFleet(workers=2, base_port=65535), "engine port 65536 is outside 1..65535"),
        (EngineFleet(workers=1000), "at most 256"),
    ],
    ids=["prefill-only", "decode-only", "negative", "too-few-ports", "port-range", "too-many"],
)
def test_plan_engines_refuses(fleet: EngineFleet, needle: str) -> None:
    with pytest.raises(ValueError) as err:
        plan_engines(fleet)
    assert needle in str(err.value)


def test_stack_deployment_keeps_names_ports_and_args() -> None:
    fleet = EngineFleet(
        prefill=1,
        decode=2,
        base_port=40000,
        profile="test",
        speedup=20.0,
        kv_blocks=512,
        block_size=16,
        deployment="demo",
        extra_args=("--max-batch", "8"),
    )
    data = stack_deployment(fleet)
    assert data is not None
    spec = parse_spec(data)  # what the autoscaler accepts
    assert (spec.name, spec.kv_block_size) == ("demo", 16)
    args = (
        "--block-size", "16", "--profile", "test", "--speedup", "20", "--kv-blocks", "512",
        "--max-batch", "8",
    )  # fmt: skip
    assert [
        (r.name, r.role, r.replicas, r.min_replicas, r.ports, r.restart_policy, r.args)
        for r in spec.roles
    ] == [
        ("prefill", "prefill", 1, 1, (40000,), "never", args),
        ("decode", "decode", 2, 2, (40001, 40002), "never", args),
    ]
    assert stack_deployment(EngineFleet()) is None


TE_URL = "http://127.0.0.1:8081/metadata"


@pytest.mark.parametrize(
    ("fleet", "data_plane"),
    [
        (EngineFleet(prefill=1, decode=1, te_metadata_url=TE_URL), True),
        (EngineFleet(prefill=1, decode=1), False),
        (EngineFleet(workers=2, te_metadata_url=TE_URL), False),
    ],
    ids=["pd-with-kvmeta-metadata", "pd-without-metadata-endpoint", "aggregated"],
)
def test_pd_engines_get_the_data_plane(fleet: EngineFleet, data_plane: bool) -> None:
    data = stack_deployment(fleet)
    assert data is not None
    for role in data["roles"]:
        tail = role["args"][-3:]
        assert (tail == ["--kv-data-plane", "--te-metadata-url", TE_URL]) is data_plane
        assert ("--kv-data-plane" in role["args"]) is data_plane


def test_engine_defaults_are_left_to_the_engine() -> None:
    data = stack_deployment(EngineFleet(workers=1))
    assert data is not None
    (role,) = data["roles"]
    assert (role["name"], role["role"], role["args"]) == (
        "engine",
        "worker",
        ["--block-size", "64"],
    )


def test_autoscaler_driver_env_is_read_by_the_autoscaler(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the stack writes is what the autoscaler's own settings loader reads: the local
    driver in the stack's state dir, the stack's ids, ports after the planned ones."""
    from services.common.settings import load_settings

    fleet = EngineFleet(workers=2, base_port=30011)
    env = autoscaler_driver_env(
        fleet, host="127.0.0.1", state_dir=tmp_path, stop_grace_s=7, planner_configured=False
    )
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    settings = load_settings(AutoscalerSettings, "autoscaler", None, {})
    driver: DriverSettings = settings.driver
    assert driver.kind == "local" and not settings.planner_enabled
    local = driver.local
    assert (local.state_dir, local.instance_id_format) == (str(tmp_path), "{role}-{n}")
    assert (local.port_min, local.port_max, local.stop_grace_s) == (30013, 30112, 7.0)
    configured = autoscaler_driver_env(
        fleet, host="h", state_dir=tmp_path, stop_grace_s=1, planner_configured=True
    )
    assert "TIDESERVE_AUTOSCALER__PLANNER_ENABLED" not in configured


@pytest.mark.parametrize(
    ("fleet", "perf", "expected"),
    [
        (EngineFleet(), "test", {}),
        (
            EngineFleet(workers=2, base_port=7000, block_size=32, deployment="d"),
            None,
            {
                "TIDESERVE_SCHEDULER__ENDPOINTS": "[]",
                "TIDESERVE_SCHEDULER__AUTOSCALER_ADDRESS": "h:50053",
                "TIDESERVE_SCHEDULER__DEPLOYMENT": "d",
                "TIDESERVE_SCHEDULER__BLOCK_SIZE": "32",
            },
        ),
        (
            EngineFleet(prefill=1, decode=1, base_port=7000),
            "test",
            {
                "TIDESERVE_SCHEDULER__ENDPOINTS": "[]",
                "TIDESERVE_SCHEDULER__AUTOSCALER_ADDRESS": "h:50053",
                "TIDESERVE_SCHEDULER__DEPLOYMENT": "default",
                "TIDESERVE_SCHEDULER__BLOCK_SIZE": "64",
                "TIDESERVE_SCHEDULER__PERF_PROFILE": "test",
            },
        ),
    ],
    ids=["no-engines-no-override", "aggregated", "pd-with-profile"],
)
def test_scheduler_engine_env(
    fleet: EngineFleet, perf: str | None, expected: dict[str, str]
) -> None:
    got = scheduler_engine_env(fleet, autoscaler_address="h:50053", perf_profile=perf)
    assert got == expected


def test_scheduler_settings_read_the_wired_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the stack writes is what the scheduler's own settings loader reads."""
    from services.common.settings import load_settings

    env = scheduler_engine_env(
        EngineFleet(prefill=1, decode=1, base_port=7000, block_size=16, deployment="x"),
        autoscaler_address="127.0.0.1:50053",
        perf_profile="test",
    )
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    settings = load_settings(SchedulerSettings, "scheduler", None, {})
    assert settings.endpoints == []  # from membership only
    assert settings.autoscaler_address == "127.0.0.1:50053" and settings.membership_stream
    assert (settings.deployment, settings.block_size, settings.perf_profile) == ("x", 16, "test")


def _spec(name: str, kind: str = "service") -> ChildSpec:
    return ChildSpec(name, ("x",), {"A": "1"}, Path(f"/tmp/{name}.log"), kind=kind)


def test_wire_scheduler_touches_only_the_scheduler() -> None:
    children = (_spec("scheduler"), _spec("kvmeta"))
    wired = wire_scheduler(children, {"B": "2"})
    assert wired[0].env == {"A": "1", "B": "2"}
    assert wired[1] is children[1]
    assert wire_scheduler(children, {}) == children


def test_start_waves_engines_first_and_stop_rank() -> None:
    children = [_spec("scheduler"), _spec("engine-1", ENGINE_KIND), _spec("kvmeta")]
    children.append(_spec("engine-2", ENGINE_KIND))
    waves = start_waves(children)
    assert [[c.name for c in w] for w in waves] == [
        ["engine-1", "engine-2"],
        ["scheduler", "kvmeta"],
    ]
    assert [[c.name for c in w] for w in start_waves(children[:1])] == [["scheduler"]]
    assert stop_rank(ENGINE_KIND) < stop_rank("service")


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([], ()),
        (["--max-batch=32"], ("--max-batch=32",)),
        (["--stream-interval 4", "--fail-rate=0.1"], ("--stream-interval", "4", "--fail-rate=0.1")),
    ],
    ids=["none", "equals-form", "quoted-pair"],
)  # fmt: skip
def test_split_engine_args(values: list[str], expected: tuple[str, ...]) -> None:
    assert split_engine_args(values) == expected


@pytest.mark.parametrize(
    "value", ["--port 1", "--redis-url=redis://x", "--block-size 8", "--bootstrap-port=8998"]
)
def test_split_engine_args_refuses_flags_the_stack_sets(value: str) -> None:
    with pytest.raises(ValueError, match="managed by the stack"):
        split_engine_args([value])


def _up_args(tmp_path: Path, *argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="verb"))
    return parser.parse_args(["up", "--state-dir", str(tmp_path), *argv])


def test_up_flags_become_engine_children_and_scheduler_wiring(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # no stray ./tideserve.yaml
    config = tmp_path / "ts.yaml"
    config.write_text("scheduler:\n  block_size: 16\n  deployment: demo\n")
    args = _up_args(
        tmp_path,
        "--config",
        str(config),
        "--prefill",
        "1",
        "--decode",
        "2",
        "--engine-profile",
        "test",
        "--engine-speedup",
        "5",
        "--engine-kv-blocks",
        "100",
        "--engine-arg=--max-batch=4",
        "--base-port-offset",
        "10",
    )
    opts, children = resolve_up(args)
    assert all(c.kind != ENGINE_KIND for c in children)  # the autoscaler runs them
    assert [(c.owner, c.port) for c in opts.engine_claims] == [
        ("prefill-1", 30011),
        ("decode-1", 30012),
        ("decode-2", 30013),
    ]
    spec = parse_spec(dict(opts.deployment))
    assert spec.name == "demo"
    assert [(r.name, r.ports) for r in spec.roles] == [
        ("prefill", (30011,)),
        ("decode", (30012, 30013)),
    ]
    args_ = spec.roles[0].args
    for flag, value in [
        ("--block-size", "16"),
        ("--profile", "test"),
        ("--speedup", "5"),
        ("--kv-blocks", "100"),
    ]:
        assert args_[args_.index(flag) + 1] == value
    assert args_[-1] == "--max-batch=4"
    assert "--kv-data-plane" in args_  # P/D: the hand-off moves bytes, at kvmeta's endpoint
    assert args_[args_.index("--te-metadata-url") + 1] == "http://127.0.0.1:8091/metadata"
    assert opts.autoscaler_address == "127.0.0.1:50063"
    scheduler = next(c for c in children if c.name == "scheduler")
    assert scheduler.env["TIDESERVE_SCHEDULER__ENDPOINTS"] == "[]"
    assert scheduler.env["TIDESERVE_SCHEDULER__AUTOSCALER_ADDRESS"] == "127.0.0.1:50063"
    assert scheduler.env["TIDESERVE_SCHEDULER__PERF_PROFILE"] == "test"
    autoscaler = next(c for c in children if c.name == "autoscaler")
    assert autoscaler.env["TIDESERVE_AUTOSCALER__DRIVER__KIND"] == "local"
    assert autoscaler.env["TIDESERVE_AUTOSCALER__DRIVER__LOCAL__STATE_DIR"] == str(tmp_path)
    assert autoscaler.env["TIDESERVE_AUTOSCALER__DRIVER__LOCAL__PORT_MIN"] == "30014"
    kvmeta = next(c for c in children if c.name == "kvmeta")
    # secured stack: the Transfer Engine sends no token to kvmeta's metadata endpoint, and
    # the engines present the services' token to kvmeta's gRPC
    assert kvmeta.env["TIDESERVE_KVMETA__METADATA_HTTP_OPEN"] == "true"
    token_file = Path(autoscaler.env["TIDESERVE_ENGINE_KVMETA_TOKEN_FILE"])
    assert token_file == opts.secrets.service_token_file and token_file.exists()
    assert not any(
        k.startswith(("TIDESERVE_SCHEDULER__", "TIDESERVE_AUTOSCALER__DRIVER")) for k in kvmeta.env
    )


def test_up_engine_settings_from_the_config_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    config = tmp_path / "ts.yaml"
    config.write_text(
        "stack:\n  engines: 2\n  engine_ports: [4101, 4100]\n  engine_args: ['--seed 3']\n"
    )
    opts, _ = resolve_up(_up_args(tmp_path, "--config", str(config)))
    (role,) = opts.deployment["roles"]
    assert (role["replicas"], role["ports"]) == (2, [4101, 4100])
    assert role["args"][-2:] == ["--seed", "3"]
    flagged, _ = resolve_up(_up_args(tmp_path, "--config", str(config), "--engines", "1"))
    assert [c.owner for c in flagged.engine_claims] == ["engine-1"]  # flags win


def test_up_without_engines_leaves_the_scheduler_endpoints_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    # no replica settings
    opts, children = resolve_up(_up_args(tmp_path, "--gateways", "1", "--engines", "0"))
    assert all(c.kind != ENGINE_KIND for c in children)
    assert opts.deployment is None and opts.engine_claims == ()
    scheduler = next(c for c in children if c.name == "scheduler")
    scheduler_keys = {k for k in scheduler.env if k.startswith("TIDESERVE_SCHEDULER__")}
    assert scheduler_keys == {"TIDESERVE_SCHEDULER__TELEMETRY_ADDRESS"}  # no engine settings
    autoscaler = next(c for c in children if c.name == "autoscaler")
    assert "TIDESERVE_AUTOSCALER__DRIVER__KIND" not in autoscaler.env  # dry-run as configured


@pytest.mark.parametrize(
    ("config", "argv", "claims"),
    [
        ("", [], ["engine-1", "engine-2"]),
        ("", ["--engines", "0"], []),
        ("", ["--engines", "3"], ["engine-1", "engine-2", "engine-3"]),
        ("", ["--prefill", "1", "--decode", "1"], ["prefill-1", "decode-1"]),
        ("stack:\n  engines: 0\n", [], []),
        ("stack:\n  engines: 1\n", [], ["engine-1"]),
        ("stack:\n  prefill: 1\n  decode: 2\n", [], ["prefill-1", "decode-1", "decode-2"]),
        ("scheduler:\n  endpoints: ['http://127.0.0.1:9']\n", [], []),
        ("scheduler:\n  endpoints: ['http://127.0.0.1:9']\n", ["--engines", "1"], ["engine-1"]),
    ],
    ids=[
        "default-two",
        "explicit-none",
        "explicit-three",
        "pd-flags",
        "config-none",
        "config-one",
        "config-pd",
        "own-endpoints",
        "own-endpoints-and-engines",
    ],
)
def test_up_starts_two_engines_unless_told_otherwise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, config: str, argv: list[str], claims: list[str]
) -> None:
    """`tideserve up` alone starts what `make run` starts: two simulated engines, unless
    flags, the stack's settings or the scheduler's own endpoints say otherwise."""
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "ts.yaml"
    path.write_text(config)
    opts, _ = resolve_up(_up_args(tmp_path, "--config", str(path), "--gateways", "1", *argv))
    assert [c.owner for c in opts.engine_claims] == claims
    assert (opts.deployment is None) == (not claims)


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--prefill", "2"], "needs at least one of each"),
        (["--engines", "1", "--engine-profile", "nope"], "--engine-profile"),
        (["--engines", "1", "--engine-arg=--port=1"], "managed by the stack"),
    ],
    ids=["prefill-without-decode", "unknown-profile", "reserved-flag"],
)
def test_up_bad_engine_flags_are_one_line_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    argv: list[str], needle: str,
) -> None:  # fmt: skip
    from services.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["up", "--state-dir", str(tmp_path / "st"), *argv]) == 2
    err = capsys.readouterr().err
    assert needle in err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "st").exists()
