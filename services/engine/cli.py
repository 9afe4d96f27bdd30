"""``tideserve engine``: run one simulated SGLang/vLLM-like engine instance."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
from typing import Any

from pydantic import ValidationError

from services.common.flags import LOG_LEVEL, STREAM_PREFIX, Flag, add_flags, flag_overrides
from services.common.perfmodel import DEFAULT_PROFILE, PROFILES
from services.engine.settings import EngineSettings

__all__ = ["main", "register", "run"]

_EPILOG = f"""\
profiles: {", ".join(sorted(PROFILES))} (default {DEFAULT_PROFILE})

examples:
  # an aggregated engine on port 30001, ten times faster than real time
  tideserve engine --port 30001 --speedup 10

  # a prefill/decode pair for sglang-router's PD mode, with KV events on Redis
  tideserve engine --port 30001 --role prefill --bootstrap-port 8998 \\
      --redis-url redis://127.0.0.1:6379/0 --deployment llama
  tideserve engine --port 30002 --role decode --redis-url redis://127.0.0.1:6379/0

  # prompts tokenized like the served model (the gateway's --model-path gives equal counts)
  tideserve engine --port 30001 --model-path /models/llama

  # a P/D pair moving real KV bytes over Mooncake's Transfer Engine (kvmeta on :8081)
  tideserve engine --port 30001 --role prefill --bootstrap-port 8998 --kv-data-plane
  tideserve engine --port 30002 --role decode --kv-data-plane

  # a DRAM segment of the KV-cache tier, mounted in kvmeta
  tideserve engine --role kvcache --port 30100 --kvcache-mib 4096 --kvmeta-address 127.0.0.1:50052

  # ... with a disk segment beside it (durable: served again after a restart)
  tideserve engine --role kvcache --port 30100 --kvcache-mib 4096 \
      --kvcache-disk-mib 65536 --kvcache-disk-dir /var/lib/tideserve/kv0

  # vLLM metric names, a small KV cache, 10% of requests fail with HTTP 500
  tideserve engine --metrics-dialect vllm --kv-blocks 2048 --fail-rate 0.1

environment: TIDESERVE_ENGINE_<SETTING> (e.g. TIDESERVE_ENGINE_SPEEDUP=10); flags win.
"""

# flag -> (settings field, type, help)
_FLAGS: list[Flag] = [
    ("--host", str, "interface to bind (default 127.0.0.1)"),
    ("--port", int, "HTTP port (default 30001; 0 = any free port)"),
    ("--instance-id", str, "instance id in events (default host:port)"),
    ("--profile", str, "performance profile (see below)"),
    ("--model", str, "served model name (default tideserve-sim)"),
    (
        "--model-path",
        str,
        "model directory: count prompt tokens with its tokenizer and chat "
        "template (default: whitespace words)",
    ),
    ("--kv-blocks", int, "KV capacity in blocks (default: what fits the profile's HBM)"),
    (
        "--kv-running-blocks",
        int,
        "at most this many blocks held by running requests; the rest of --kv-blocks only "
        "caches (default: all; a reference engine with more cache but the same batches)",
    ),
    ("--block-size", int, "tokens per KV block (default 64; must divide 512)"),
    ("--max-batch", int, "max running sequences (default 256)"),
    ("--max-batched-tokens", int, "token budget per step / prefill chunk (default 8192)"),
    ("--speedup", float, "run modelled time this many times faster (default 1)"),
    ("--stream-interval", int, "tokens per streamed chunk (default 1)"),
    ("--default-max-tokens", int, "max tokens when a request gives none (default 128)"),
    ("--redis-url", str, "publish KV events and load snapshots to this Redis"),
    ("--deployment", str, "deployment name in stream names (default 'default')"),
    STREAM_PREFIX,
    ("--bootstrap-port", int, "prefill role: also serve the KV rendezvous on this port"),
    ("--state-dir", str, "where the stub model directory is written"),
    ("--te-metadata-url", str, "data plane: kvmeta's metadata endpoint (http://H:8081/metadata)"),
    ("--te-protocol", str, "data plane: tcp (default) or rdma"),
    ("--te-device", str, "data plane, rdma: NIC names (default: discovered)"),
    ("--te-hostname", str, "data plane: segment name host:port (default host:<port>)"),
    ("--kv-bytes-scale", int, "data plane: KV bytes per block = profile's / this (default 256)"),
    ("--kv-transfer-timeout-s", float, "data plane: a slower KV pull recomputes (default 10)"),
    ("--kvmeta-address", str, "kvcache role: kvmeta's gRPC address (default 127.0.0.1:50052)"),
    ("--kvcache-policy", str, "tier: write_through (default) or offload_on_evict"),
    ("--kvcache-disk-url", str, "tier: store on this kvcache instance's disk segment (its URL)"),
    ("--kvcache-mib", int, "kvcache role: DRAM segment size in MiB (default 1024)"),
    ("--kvcache-disk-mib", int, "kvcache role: disk segment size in MiB (default 0: none)"),
    (
        "--kvcache-disk-dir",
        str,
        "kvcache role: disk segment files (default <state-dir>/kvcache-disk)",
    ),
    (
        "--kvcache-disk-compact-records",
        int,
        "kvcache role: snapshot the disk index every N records",
    ),
    ("--fail-rate", float, "fault: fraction of requests answered HTTP 500"),
    ("--die-after-tokens", int, "fault: close each stream abruptly after N tokens"),
    ("--seed", int, "seed of the fault injector"),
    ("--catch-up-ms", float, "keep the modelled step schedule up to this far behind (200)"),
    ("--step-trace", str, "diagnostic: write each step and request as JSON lines to this file"),
    LOG_LEVEL,
]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "engine",
        help="run one simulated inference engine (SGLang/vLLM API)",
        description="A GPU-free engine: continuous batching, paged KV cache with prefix reuse, "
        "a roofline timing model, SGLang/vLLM endpoints and metrics.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--role",
        choices=["aggregated", "prefill", "decode", "kvcache"],
        default=None,
        help="kvcache: a DRAM segment of the KV-cache tier mounted in kvmeta (no model)",
    )
    p.add_argument("--metrics-dialect", choices=["sglang", "vllm"], default=None)
    p.add_argument("--refuse-health", action="store_true", default=None, help="fault: /health 503")
    p.add_argument(
        "--kv-data-plane",
        action="store_true",
        default=None,
        help="hold real KV bytes and move them over Mooncake's Transfer Engine (P/D)",
    )
    p.add_argument(
        "--kvcache-tier",
        action="store_true",
        default=None,
        help="write cached blocks through to the KV-cache tier and fetch prefixes from it "
        "(kvmeta at --kvmeta-address; implies --kv-data-plane)",
    )
    add_flags(p, _FLAGS)
    p.set_defaults(func=run)


def settings_from_args(args: argparse.Namespace) -> EngineSettings:
    overrides = flag_overrides(
        args,
        _FLAGS,
        ["role", "metrics_dialect", "refuse_health", "kv_data_plane", "kvcache_tier"],
    )
    return EngineSettings(**overrides)


def run(args: argparse.Namespace) -> int:
    try:
        settings = settings_from_args(args)
        if 512 % settings.block_size:
            raise ValueError(f"--block-size {settings.block_size} must divide 512")
        from services.common.perfmodel import get_profile
        from services.common.tokens import token_path

        get_profile(settings.profile)
        token_path(settings.model_path)  # a bad model directory fails here (ValueError)
    except ValidationError as err:
        first = err.errors()[0]
        print(
            f"tideserve engine: invalid setting {first['loc'][0]}: {first['msg']}", file=sys.stderr
        )
        return 2
    except (ValueError, KeyError) as err:
        print(f"tideserve engine: {str(err).strip(chr(39))}", file=sys.stderr)
        return 2
    # Text lines on stderr; inside a traced request they carry its trace and span ids.
    from services.common.logs import configure_logging

    configure_logging(settings.log_level, "text", "engine")
    import grpc

    from services.common.dataplane.transfer import DataPlaneError

    try:
        return asyncio.run(serve(settings))
    except DataPlaneError as err:
        print(f"tideserve engine: data plane: {err}", file=sys.stderr)
        return 2
    except grpc.aio.AioRpcError as err:
        print(
            f"tideserve engine: kvmeta at {settings.kvmeta_address}: {err.code().name}: "
            f"{err.details()}",
            file=sys.stderr,
        )
        return 2
    except OSError as err:
        print(
            f"tideserve engine: cannot listen on {settings.host}:{settings.port}: {err.strerror}",
            file=sys.stderr,
        )
        return 2


async def serve(settings: EngineSettings, stop: asyncio.Event | None = None) -> int:
    """Serve until SIGINT/SIGTERM (or ``stop`` is set). Returns the exit code."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    if settings.role == "kvcache":
        from services.engine.kvcache_role import serve_kvcache

        return await serve_kvcache(settings, stop)
    from aiohttp import web

    from services.engine.server import EngineServer

    redis: Any = None
    if settings.redis_url:
        from services.common.redis_client import redis_client

        redis = redis_client(settings.redis_url, settings.redis_client)
        try:
            await redis.ping()
        except Exception as err:
            print(
                f"tideserve engine: Redis at {settings.redis_url} unreachable: {err}",
                file=sys.stderr,
            )
            await redis.aclose()
            return 2
    provider = None
    if settings.trace_exporter != "none":
        from services.common.errors import SettingsError
        from services.common.otel import configure_tracing

        try:
            provider = configure_tracing(settings, "engine")
        except SettingsError as err:
            print(f"tideserve engine: {err}", file=sys.stderr)
            if redis is not None:
                await redis.aclose()
            return 2
    engine = EngineServer(settings, redis=redis, tracer_provider=provider)
    runner = web.AppRunner(engine.app(), handle_signals=False)
    await runner.setup()
    try:
        site = web.TCPSite(runner, settings.host, settings.port)
        await site.start()
        if settings.port == 0:
            engine.bind(runner.addresses[0][1])
        logging.getLogger(__name__).info(
            "engine %s (%s, %s) serving on %s",
            engine.instance_id,
            settings.role,
            settings.profile,
            engine.url,
        )
        await stop.wait()
    finally:
        await runner.cleanup()
        if redis is not None:
            await redis.aclose()
        if provider is not None:
            provider.shutdown()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tideserve")
    register(parser.add_subparsers(dest="verb", required=True))
    args = parser.parse_args(["engine", *(argv if argv is not None else sys.argv[1:])])
    return int(args.func(args))
