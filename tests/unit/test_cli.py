"""The `tideserve` entry point: verbs from command modules, help with examples, usage errors."""

from __future__ import annotations

import argparse
import json
import socket
import sys
from pathlib import Path

import pytest

from services.cli import COMMAND_MODULES, build_parser, main
from services.common.local.state import ProcEntry, StackState, write_state


def _verbs(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    raise AssertionError("no subcommands")


def test_top_level_help_shows_examples(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "examples:" in out
    assert "tideserve up" in out


def test_stack_verbs_are_registered() -> None:
    assert {"up", "down", "status"} <= set(_verbs(build_parser()))


@pytest.mark.parametrize("verb", sorted(_verbs(build_parser())))
def test_every_verb_help_has_examples(verb: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([verb, "--help"]) == 0
    out = capsys.readouterr().out
    assert "examples:" in out, f"`tideserve {verb} --help` shows no examples"
    assert f"tideserve {verb}" in out


@pytest.mark.parametrize(
    ("argv", "needle"),
    [(["frobnicate"], "invalid choice: 'frobnicate'"), ([], "required")],
    ids=["unknown-verb", "no-verb"],
)
def test_usage_errors_exit_2(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    assert needle in capsys.readouterr().err


def test_up_rejects_bad_offset_type(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["up", "--base-port-offset", "many"]) == 2
    assert "--base-port-offset" in capsys.readouterr().err


def test_missing_command_module_is_skipped_broken_one_raises(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "ts_cli_good.py").write_text(
        "def register(sub):\n"
        "    p = sub.add_parser('hello', epilog='examples:\\n  tideserve hello')\n"
        "    p.set_defaults(func=lambda args: 7)\n"
    )
    (tmp_path / "ts_cli_broken.py").write_text("import ts_no_such_dependency_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    parser = build_parser(["ts_cli_good", "ts_cli_absent_module"])
    assert set(_verbs(parser)) == {"hello"}
    args = parser.parse_args(["hello"])
    assert args.func(args) == 7
    with pytest.raises(ModuleNotFoundError, match="ts_no_such_dependency_xyz"):
        build_parser(["ts_cli_broken"])
    sys.modules.pop("ts_cli_good", None)
    sys.modules.pop("ts_cli_broken", None)


def test_stack_module_is_first_in_registry() -> None:
    assert COMMAND_MODULES[0] == "services.stack.cli"


def _up_args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["up", *argv])


def test_up_reads_ports_from_the_config_file_and_offsets_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from services.stack.cli import resolve_up

    monkeypatch.delenv("TIDESERVE_CONFIG", raising=False)
    config = tmp_path / "ts.yaml"
    config.write_text(
        "kvmeta:\n  grpc_port: 41000\n  metadata_http_port: 0\n"
        "scheduler:\n  http_port: 42000\nstack:\n  redis_port: 43000\n"
    )
    opts, children = resolve_up(
        _up_args(
            "--config", str(config), "--state-dir", str(tmp_path / "st"), "--base-port-offset", "5"
        )
    )
    assert opts.state_dir == (tmp_path / "st").resolve()
    assert opts.redis_port == 43005
    assert opts.postgres_url is None and opts.redis_url is None  # → embedded servers
    ports = {c.name: {p.setting: p.port for p in c.ports} for c in children}
    assert ports["kvmeta"] == {"grpc_port": 41005, "metrics_port": 9107}  # TE metadata off
    assert ports["scheduler"] == {"grpc_port": 50056, "metrics_port": 9106, "http_port": 42005}
    assert children[1].argv[-2:] == ("--config", str(config.resolve()))


@pytest.mark.parametrize(
    ("yaml_text", "needle"),
    [
        ("stack:\n  bogus: 1\n", "stack.bogus"),
        ("kvmeta:\n  grpc_port: 0\n", "kvmeta.grpc_port"),
        ("stack:\n  redis_port: nope\n", "stack.redis_port"),
    ],
    ids=["unknown-setting", "grpc-port-zero", "not-a-number"],
)
def test_up_bad_config_is_one_line_exit_2(
    tmp_path: Path, yaml_text: str, needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "ts.yaml"
    config.write_text(yaml_text)
    assert main(["up", "--config", str(config), "--state-dir", str(tmp_path / "st")]) == 2
    err = capsys.readouterr().err
    assert needle in err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "st").exists()  # nothing started, nothing written


def test_down_and_status_without_a_stack(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["down", "--state-dir", str(tmp_path)]) == 0
    assert "no stack running" in capsys.readouterr().out
    assert main(["status", "--state-dir", str(tmp_path)]) == 1
    assert "no stack running" in capsys.readouterr().out
    assert main(["status", "--state-dir", str(tmp_path), "--json"]) == 1
    assert json.loads(capsys.readouterr().out) == {"running": False, "services": [], "infra": []}


def test_status_of_a_dead_stack_is_unreachable_and_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    write_state(
        tmp_path,
        StackState(
            up=ProcEntry("up", 999_999_998, None, kind="up"),
            state_dir=str(tmp_path),
            phase="running",
            processes=[
                ProcEntry("redis", 999_999_997, None, kind="redis", url="redis://127.0.0.1:1/0"),
                ProcEntry(
                    "kvmeta", 999_999_999, None, kind="service", grpc_address=f"127.0.0.1:{port}"
                ),
            ],
        ),
    )
    assert main(["status", "--state-dir", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "NOT running" in out
    assert f"kvmeta      127.0.0.1:{port}" in out and "UNREACHABLE" in out
    assert main(["status", "--state-dir", str(tmp_path), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["serving"] is False
    assert report["services"] == [
        {
            "name": "kvmeta",
            "address": f"127.0.0.1:{port}",
            "pid": 999_999_999,
            "alive": False,
            "health": "UNREACHABLE",
            "metrics_url": None,
        }
    ]
    assert report["infra"] == [
        {"name": "redis", "pid": 999_999_997, "alive": False, "url": "redis://127.0.0.1:1/0"}
    ]
    # `down` on a stack whose processes are all gone just clears the state file
    assert main(["down", "--state-dir", str(tmp_path)]) == 0
    assert "no stack running" in capsys.readouterr().out
    assert not (tmp_path / "stack.json").exists()
