"""``tideserve kv-bridge`` argument handling and start-up refusals (no servers needed)."""

from __future__ import annotations

import socket

import pytest

from services.cli import build_parser
from services.kvbridge.cli import main, register, settings_from_args
from services.kvbridge.wire import Engine


def parse(*argv: str) -> object:
    import argparse

    parser = argparse.ArgumentParser(prog="tideserve")
    register(parser.add_subparsers(dest="verb", required=True))
    return parser.parse_args(["kv-bridge", *argv])


def test_verb_is_registered() -> None:
    assert "kv-bridge" in build_parser().format_help()


def test_flags_become_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: object) -> None:
    monkeypatch.chdir(tmp_path)  # type: ignore[arg-type]
    monkeypatch.setenv("TIDESERVE_TENANT", "from-env")
    s = settings_from_args(
        parse(  # type: ignore[arg-type]
            "--engine",
            "sglang",
            "--endpoint",
            "tcp://10.0.0.8:5557",
            "--replay-endpoint",
            "tcp://10.0.0.8:5558",
            "--deployment",
            "qwen",
            "--kv-group",
            "-1",
            "--redis-url",
            "redis://127.0.0.1:1/0",
        )
    )
    assert s.engine is Engine.SGLANG
    assert (s.endpoint, s.replay_endpoint, s.deployment, s.kv_group) == (
        "tcp://10.0.0.8:5557",
        "tcp://10.0.0.8:5558",
        "qwen",
        -1,
    )
    assert s.tenant == "from-env"
    assert s.effective_instance_id == "tcp://10.0.0.8:5557"


@pytest.mark.parametrize(
    ("argv", "environ", "expected"),
    [
        (["--redis-url", "redis://a/0"], {"ENGINE_URL": "redis://e/0"}, "redis://a/0"),
        (["--redis-url-env", "ENGINE_URL"], {"ENGINE_URL": "redis://e/0"}, "redis://e/0"),
        (
            ["--redis-url", "redis://a/0", "--redis-url-env", "ENGINE_URL"],
            {"ENGINE_URL": "redis://e/0"},
            "redis://e/0",
        ),
    ],
    ids=["flag", "from-env-var", "env-var-wins"],
)
def test_redis_url_from_a_named_variable(
    argv: list[str],
    environ: dict[str, str],
    expected: str,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: object,
) -> None:
    """A sidecar beside an engine publishes as the engine's Redis user, whose URL only its
    environment holds (the process's own TIDESERVE_REDIS_URL may be another service's)."""
    monkeypatch.chdir(tmp_path)  # type: ignore[arg-type]
    monkeypatch.setenv("TIDESERVE_REDIS_URL", "redis://someone-else/0")
    s = settings_from_args(parse(*argv), environ)  # type: ignore[arg-type]
    assert s.redis_url == expected


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--endpoint", "10.0.0.8:5557", "--redis-url", "redis://x"], "kv_bridge.endpoint"),
        (["--kv-group", "-2", "--redis-url", "redis://x"], "kv_bridge.kv_group"),
        ([], "redis_url) is required"),
        (["--redis-url", "redis://127.0.0.1:{port}/0"], "cannot reach Redis"),
        (["--engine", "tgi"], "invalid choice"),
        (["--redis-url-env", "TS_TEST_UNSET_VARIABLE"], "TS_TEST_UNSET_VARIABLE is not set"),
    ],
    ids=[
        "endpoint-without-scheme",
        "kv-group-below-minus-one",
        "no-redis",
        "redis-down",
        "engine",
        "redis-url-env-unset",
    ],
)
def test_refusals_exit_2_with_one_line(
    argv: list[str],
    message: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: object,
) -> None:
    monkeypatch.chdir(tmp_path)  # type: ignore[arg-type]
    monkeypatch.delenv("TIDESERVE_REDIS_URL", raising=False)
    port = closed_port()
    assert main([a.format(port=port) for a in argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err
    assert "Traceback" not in err
