"""The `tideserve` entry point: verbs from command modules, help with examples, usage errors."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

from services.cli import COMMAND_MODULES, build_parser, main


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
