"""Real engines in the local stack: ``tideserve up --engine vllm|sglang --model-path DIR``.
Pure: no I/O.

The stack's engines are still one deployment of its autoscaler (see
:mod:`services.stack.deployment`); with a real engine kind the role runs the engine's own
server instead of the simulator, and a ``tideserve kv-bridge`` sidecar beside each instance:

- the engine serves the model directory under ``model_name`` (default: the directory's name)
  on the role's ``{host}:{port}``, with the scheduler's block size, cached tokens in usage,
  and its KV events on ZMQ ipc sockets in the instance's own state directory
  (``ipc://{state_dir}/kv``, replay on ``ipc://{state_dir}/kv-replay``);
- the sidecar republishes those events on the stack's Redis under the instance's id, as the
  engine's Redis user (``--redis-url-env``: the stack hands engines their Redis URL in
  :data:`~services.stack.engines.ENGINE_REDIS_ENV`), so kvmeta and the gateways index them;
- the scheduler tokenizes with the model's tokenizer and chat template and hashes blocks with
  the engine's scheme (:func:`scheduler_model_env`).

Only aggregated engines: a P/D fleet of real engines needs a KV connector chosen for the
hardware, which a deployment spec applied with ``tideserve apply`` states (docs/real-engines.md).
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from services.stack.engines import ENGINE_REDIS_ENV, RealEngine

__all__ = [
    "DEFAULT_COMMANDS",
    "REAL_ENGINES",
    "RESERVED_FLAGS",
    "check_real_engine",
    "real_role",
    "scheduler_model_env",
]

REAL_ENGINES = ("vllm", "sglang")

DEFAULT_COMMANDS: dict[str, tuple[str, ...]] = {
    "vllm": ("vllm", "serve"),
    "sglang": ("python", "-m", "sglang.launch_server"),
}
"""The engine's server when ``engine_command`` is not set (its flags follow)."""

RESERVED_FLAGS: dict[str, tuple[str, ...]] = {
    "vllm": (
        "--host", "--port", "--model", "--served-model-name", "--block-size",
        "--kv-events-config",
    ),
    "sglang": (
        "--host", "--port", "--model-path", "--served-model-name", "--page-size",
        "--kv-events-config",
    ),
}  # fmt: skip
"""Flags the stack sets on a real engine; ``--engine-arg`` may not."""


def check_real_engine(
    engine: RealEngine, *, prefill: int, decode: int, sim_only: list[str]
) -> None:
    """ValueError (one line) for an unknown kind, a missing model path, a P/D fleet, or
    simulator settings (``sim_only``: the names of those that were set)."""
    kind = engine.kind
    if kind not in REAL_ENGINES:
        raise ValueError(f"--engine {kind}: expected sim, {' or '.join(REAL_ENGINES)}")
    if not engine.model_path:
        raise ValueError(f"--engine {kind} needs --model-path DIR (the served model)")
    if prefill or decode:
        raise ValueError(
            f"--engine {kind} runs aggregated engines: for prefill/decode roles with a KV "
            "connector, apply a deployment spec (tideserve apply -f; docs/real-engines.md)"
        )
    if sim_only:
        raise ValueError(f"--engine {kind}: {', '.join(sim_only)} only apply to simulated engines")


def _escaped_json(data: dict[str, Any]) -> str:
    """JSON for a command word that goes through the driver's placeholder substitution:
    literal braces doubled, ``{state_dir}`` kept as a placeholder."""
    text = json.dumps(data, separators=(",", ":"))
    return text.replace("{", "{{").replace("}", "}}").replace("{{state_dir}}", "{state_dir}")


def _events_config(kind: str) -> str:
    config: dict[str, Any] = {
        "publisher": "zmq",
        "endpoint": "ipc://{state_dir}/kv",
        "replay_endpoint": "ipc://{state_dir}/kv-replay",
        "topic": "kv",
    }
    if kind == "vllm":
        config = {"enable_kv_cache_events": True, **config}
    return _escaped_json(config)


def _engine_args(engine: RealEngine, block_size: int, extra: tuple[str, ...]) -> list[str]:
    model = ["--model"] if engine.kind == "vllm" else ["--model-path"]
    size = "--block-size" if engine.kind == "vllm" else "--page-size"
    # cached prompt tokens in the usage: the records compare them with the prediction
    report = "--enable-prompt-tokens-details" if engine.kind == "vllm" else "--enable-cache-report"
    return [
        "--host", "{host}", "--port", "{port}",
        *model, engine.model_path, "--served-model-name", engine.served_name,
        size, str(block_size), report,
        "--kv-events-config", _events_config(engine.kind),
        *extra,
    ]  # fmt: skip


def _bridge(engine: RealEngine, block_size: int, stream_prefix: str) -> str:
    return shlex.join(
        (
            engine.python, "-m", "services.cli", "kv-bridge", "--engine", engine.kind,
            "--endpoint", "ipc://{state_dir}/kv",
            "--replay-endpoint", "ipc://{state_dir}/kv-replay", "--topic", "kv",
            "--deployment", "{deployment}", "--instance-id", "{instance_id}",
            "--block-size", str(block_size),
            "--redis-url-env", ENGINE_REDIS_ENV, "--stream-prefix", stream_prefix,
        )
    )  # fmt: skip


def real_role(
    engine: RealEngine,
    *,
    replicas: int,
    max_replicas: int,
    ports: list[int],
    block_size: int,
    stream_prefix: str,
    extra_args: tuple[str, ...],
) -> dict[str, Any]:
    """The deployment role (YAML data for :func:`services.common.planner.spec.parse_spec`) of
    ``replicas`` aggregated instances of ``engine``, each with its kv-bridge sidecar."""
    command = engine.command or DEFAULT_COMMANDS[engine.kind]
    return {
        "name": "engine",
        "role": "worker",
        "replicas": replicas,
        "min_replicas": replicas,
        "max_replicas": max_replicas,
        "engine": engine.kind,
        "template": shlex.join(command),
        "args": _engine_args(engine, block_size, extra_args),
        "restart_policy": "never",
        "ports": ports,
        "sidecars": [_bridge(engine, block_size, stream_prefix)],
        "startup_timeout_s": engine.startup_timeout_s,
    }


def scheduler_model_env(engine: RealEngine) -> dict[str, str]:
    """The scheduler's environment for ``engine``: the model's tokenizer and chat template,
    the engine's block-hash scheme, and the served model name."""
    return {
        "TIDESERVE_SCHEDULER__MODEL_PATH": engine.model_path,
        "TIDESERVE_SCHEDULER__HASH_SCHEME": engine.kind,
        "TIDESERVE_SCHEDULER__MODELS": json.dumps([engine.served_name]),
    }
