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
    ],
    ids=["endpoint-without-scheme", "kv-group-below-minus-one", "no-redis", "redis-down", "engine"],
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
