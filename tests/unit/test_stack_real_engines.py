"""``tideserve up --engine vllm|sglang --model-path DIR``: the stack's deployment runs the
real engine's server with its KV events on the instance's own ipc sockets and a kv-bridge
sidecar that publishes them as the engine's Redis user; the scheduler tokenizes by the model
and hashes by the engine's scheme. (The processes themselves: tests/real_engines.)"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

import pytest

from services.autoscaler.drivers.argv import render_argv, render_sidecars
from services.autoscaler.seam import role_target
from services.common.planner.spec import parse_spec
from services.kvbridge.cli import register as register_bridge
from services.kvbridge.cli import settings_from_args
from services.stack.cli import register, resolve_up


def _up(tmp_path: Path, *argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="verb"))
    return parser.parse_args(["up", "--state-dir", str(tmp_path / "state"), "--insecure", *argv])


@pytest.fixture
def model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)  # no stray ./tideserve.yaml
    path = tmp_path / "models" / "tiny-llama"
    path.mkdir(parents=True)
    return path


def _flag(words: tuple[str, ...] | list[str], flag: str) -> str:
    return words[list(words).index(flag) + 1]


@pytest.mark.parametrize(
    ("engine", "command", "model_flag", "size_flag", "scheme"),
    [
        ("vllm", ("vllm", "serve"), "--model", "--block-size", "vllm"),
        ("sglang", ("python", "-m", "sglang.launch_server"), "--model-path", "--page-size", "sglang"),
    ],
    ids=["vllm", "sglang"],
)  # fmt: skip
def test_real_engine_role_renders_server_and_bridge(
    engine: str,
    command: tuple[str, ...],
    model_flag: str,
    size_flag: str,
    scheme: str,
    model: Path,
    tmp_path: Path,
) -> None:
    config = tmp_path / "ts.yaml"
    config.write_text("scheduler:\n  block_size: 128\n")
    opts, children = resolve_up(
        _up(tmp_path, "--config", str(config), "--engine", engine, "--model-path", str(model),
            "--engines", "2", "--engine-arg", "--max-num-seqs 8")
    )  # fmt: skip
    spec = parse_spec(dict(opts.deployment))
    (role,) = spec.roles
    assert (role.name, role.engine, role.replicas, role.restart_policy) == (
        "engine", engine, 2, "never",
    )  # fmt: skip
    assert role.startup_timeout_s == opts.engines_timeout_s == 600.0
    target = role_target(spec.name, role, 2)
    state = tmp_path / "engines"
    argv = render_argv(
        target, host="127.0.0.1", port=30001, instance_id="engine-1", state_dir=state
    )
    assert argv[: len(command)] == command
    assert _flag(argv, model_flag) == str(model)
    assert _flag(argv, "--served-model-name") == "tiny-llama"
    assert (_flag(argv, "--host"), _flag(argv, "--port"), _flag(argv, size_flag)) == (
        "127.0.0.1", "30001", "128",
    )  # fmt: skip
    assert argv[-2:] == ("--max-num-seqs", "8")
    events = json.loads(_flag(argv, "--kv-events-config"))
    assert events["endpoint"] == f"ipc://{state}/engine-1/kv"
    assert events["replay_endpoint"] == f"ipc://{state}/engine-1/kv-replay"
    assert events.get("enable_kv_cache_events", True) is True

    (sidecar,) = render_sidecars(
        target, host="127.0.0.1", port=30001, instance_id="engine-1", state_dir=state
    )
    assert sidecar[:4] == (sys.executable, "-m", "services.cli", "kv-bridge")
    parser = argparse.ArgumentParser()
    register_bridge(parser.add_subparsers(dest="verb"))
    bridge = settings_from_args(
        parser.parse_args(list(sidecar[3:])), {"TIDESERVE_ENGINE_REDIS_URL": "redis://engine@r/0"}
    )
    assert (bridge.engine.value, bridge.endpoint, bridge.replay_endpoint) == (
        engine, events["endpoint"], events["replay_endpoint"],
    )  # fmt: skip
    assert (bridge.instance_id, bridge.deployment, bridge.redis_url) == (
        "engine-1", spec.name, "redis://engine@r/0",
    )  # fmt: skip

    (scheduler,) = [c for c in children if c.name == "scheduler"]
    assert scheduler.env["TIDESERVE_SCHEDULER__MODEL_PATH"] == str(model)
    assert scheduler.env["TIDESERVE_SCHEDULER__HASH_SCHEME"] == scheme
    assert json.loads(scheduler.env["TIDESERVE_SCHEDULER__MODELS"]) == ["tiny-llama"]


def test_engine_command_and_model_name_from_flags(model: Path, tmp_path: Path) -> None:
    cmd = "/opt/vllm/bin/python -m vllm.entrypoints.openai.api_server"
    opts, children = resolve_up(
        _up(tmp_path, "--engine", "vllm", "--model-path", str(model), "--engines", "1",
            "--engine-command", cmd, "--model-name", "llama")
    )  # fmt: skip
    (role,) = parse_spec(dict(opts.deployment)).roles
    assert tuple(shlex.split(role.template)) == tuple(shlex.split(cmd))
    assert _flag(role.args, "--served-model-name") == "llama"
    (scheduler,) = [c for c in children if c.name == "scheduler"]
    assert json.loads(scheduler.env["TIDESERVE_SCHEDULER__MODELS"]) == ["llama"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--engine", "vllm"], "needs --model-path DIR"),
        (["--engine", "vllm", "--model-path", "{missing}"], "not a directory"),
        (["--engine", "vllm", "--model-path", "{model}", "--prefill", "1", "--decode", "1"],
         "runs aggregated engines"),
        (["--engine", "sglang", "--model-path", "{model}", "--engine-speedup", "2"],
         "engine_speedup only apply to simulated engines"),
        (["--engine", "vllm", "--model-path", "{model}", "--engine-arg", "--port 9"],
         "--engine-arg --port: managed by the stack for --engine vllm"),
        (["--engine", "sglang", "--model-path", "{model}", "--engine-arg=--page-size=4"],
         "--engine-arg --page-size: managed by the stack for --engine sglang"),
    ],
    ids=["no-model", "model-not-a-dir", "pd", "sim-flag", "reserved-vllm-flag", "reserved-sglang-flag"],
)  # fmt: skip
def test_refusals(argv: list[str], message: str, model: Path, tmp_path: Path) -> None:
    values = {"model": str(model), "missing": str(tmp_path / "nope")}
    with pytest.raises(ValueError, match=message):
        resolve_up(_up(tmp_path, *[a.format(**values) for a in argv]))
    assert not (tmp_path / "state").exists()


def test_simulated_engines_are_unchanged(model: Path, tmp_path: Path) -> None:
    opts, children = resolve_up(_up(tmp_path, "--engines", "1"))
    (role,) = parse_spec(dict(opts.deployment)).roles
    assert (role.engine, role.sidecars, role.template) == ("sim", (), "")
    assert opts.engines_timeout_s is None
    (scheduler,) = [c for c in children if c.name == "scheduler"]
    assert "TIDESERVE_SCHEDULER__MODEL_PATH" not in scheduler.env
