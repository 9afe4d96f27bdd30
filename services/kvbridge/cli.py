"""``tideserve kv-bridge``: republish a real engine's ZMQ KV events on the Redis stream."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Mapping

from services.common.flags import LOG_LEVEL, STREAM_PREFIX, Flag, add_flags, flag_overrides
from services.common.logs import configure_logging
from services.common.settings import SettingsError, load_settings
from services.common.streams import check_redis
from services.kvbridge.settings import KVBridgeSettings

__all__ = ["main", "register", "run", "serve"]

_EPILOG = """\
examples:
  # vLLM started with --kv-events-config '{"enable_kv_cache_events": true,
  #   "publisher": "zmq", "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558"}'
  tideserve kv-bridge --engine vllm --endpoint tcp://10.0.0.7:5557 \\
      --replay-endpoint tcp://10.0.0.7:5558 --deployment llama --instance-id llama-p0 \\
      --redis-url redis://127.0.0.1:6379/0

  # SGLang started with --kv-events-config '{"publisher": "zmq", "endpoint": "tcp://*:5557"}'
  tideserve kv-bridge --engine sglang --endpoint tcp://10.0.0.8:5557 --deployment qwen

settings: the kv_bridge section of tideserve.yaml, TIDESERVE_* env; flags win.
Block hashes are the engine's own (see services/kvbridge/README.md).
"""

# flag -> (settings field, type, help)
_FLAGS: list[Flag] = [
    ("--endpoint", str, "engine ZMQ PUB endpoint (default tcp://127.0.0.1:5557)"),
    ("--replay-endpoint", str, "engine ZMQ ROUTER replay endpoint (enables gap replay)"),
    ("--topic", str, "ZMQ topic the engine publishes on (default: all)"),
    ("--deployment", str, "deployment name (stream ts:kv:{deployment}; default 'default')"),
    ("--instance-id", str, "instance id in events (default: the endpoint)"),
    ("--tenant", str, "tenant namespace stamped on events (default '')"),
    ("--kv-group", int, "vLLM KV cache group to index (default 0; -1 = all)"),
    ("--block-size", int, "block size when events carry none"),
    ("--replay-timeout-s", float, "silence that ends a replay (default 2)"),
    ("--redis-url", str, "Redis to publish to (required, unless --redis-url-env names it)"),
    (
        "--redis-url-env",
        str,
        "take the Redis URL from this environment variable (a sidecar beside an engine: "
        "TIDESERVE_ENGINE_REDIS_URL, the engine's own Redis user); wins over --redis-url",
    ),
    STREAM_PREFIX,
    LOG_LEVEL,
]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "kv-bridge",
        help="republish a vLLM/SGLang engine's ZMQ KV events as Tideserve events",
        description="Subscribe to a real engine's KV-event publisher (ZMQ, msgpack) and "
        "publish tideserve.v1.KVEventBatch messages on the Redis stream ts:kv:{deployment}.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--engine", choices=["vllm", "sglang"], default=None, help="wire dialect")
    p.add_argument("--config", default=None, help="tideserve.yaml (section kv_bridge)")
    add_flags(p, _FLAGS)
    p.set_defaults(func=run)


def settings_from_args(
    args: argparse.Namespace, environ: Mapping[str, str] | None = None
) -> KVBridgeSettings:
    """Settings from file < env < flags, then ``redis_url`` from ``redis_url_env`` when it
    names a variable of ``environ`` (default: the process environment); raises SettingsError
    (one line), also for a ``redis_url_env`` that is not set."""
    overrides = flag_overrides(args, _FLAGS, ["engine"])
    settings = load_settings(
        KVBridgeSettings, "kv_bridge", getattr(args, "config", None), overrides
    )
    if not settings.redis_url_env:
        return settings
    url = (os.environ if environ is None else environ).get(settings.redis_url_env, "")
    if not url:
        raise SettingsError(
            f"redis_url_env: environment variable {settings.redis_url_env} is not set"
        )
    return settings.model_copy(update={"redis_url": url})


def run(args: argparse.Namespace) -> int:
    try:
        settings = settings_from_args(args)
    except SettingsError as err:
        print(f"tideserve kv-bridge: {err}", file=sys.stderr)
        return 2
    if not settings.redis_url:
        print("tideserve kv-bridge: --redis-url (redis_url) is required", file=sys.stderr)
        return 2
    configure_logging(settings.log_level, settings.log_format, "kv-bridge")
    return asyncio.run(serve(settings))


async def serve(settings: KVBridgeSettings, stop: asyncio.Event | None = None) -> int:
    """Bridge until SIGINT/SIGTERM (or ``stop``). Exit code 2 when Redis is unreachable."""
    from services.common.redis_client import redis_client
    from services.kvbridge.run import KVBridge

    assert settings.redis_url is not None
    try:
        await check_redis(settings.redis_url)
    except ConnectionError as err:
        print(f"tideserve kv-bridge: {err}", file=sys.stderr)
        return 2
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    redis = redis_client(settings.redis_url, settings.redis_client)
    try:
        await KVBridge(settings, redis).run(stop)
    finally:
        await redis.aclose()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tideserve")
    register(parser.add_subparsers(dest="verb", required=True))
    try:
        args = parser.parse_args(["kv-bridge", *(argv if argv is not None else sys.argv[1:])])
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    return int(args.func(args))
