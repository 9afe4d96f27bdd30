"""``tideserve gateway``: the OpenAI-compatible gateway standalone, in front of engines."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from services.common import runtime
from services.common.admission.shaper_config import (
    DISPATCH_FOLLOW_MS,
    DISPATCH_HOLD_MS,
    DISPATCH_PROTECT_WHEN_MISSED,
)
from services.common.verbs import Flag, add_flags, flag
from services.scheduler.replicas import GatewayCount, gateway_count, parse_gateway_count

if TYPE_CHECKING:
    from services.scheduler.settings import SchedulerSettings

__all__ = ["register", "run", "settings_from_args", "slo_file_values"]

_EPILOG = """\
examples:
  # aggregated engines, the default profile (predicted TTFT + prefix + load guard)
  tideserve gateway --port 8000 --endpoints http://127.0.0.1:30001 http://127.0.0.1:30002

  # a baseline profile, for comparisons
  tideserve gateway --endpoints http://127.0.0.1:30001 http://127.0.0.1:30002 --profile cache_aware

  # vLLM engines serving a model: tokenize with its tokenizer and chat template, hash blocks
  # like vLLM, so precise prefix data (kvmeta, fed by kv-bridge) matches their KV events
  tideserve gateway --endpoints URL... --model-path /models/llama --hash-scheme vllm \
      --kvmeta-address 127.0.0.1:50052

  # P/D: prefill engines with their bootstrap port, decode engines (SGLang-style hand-off)
  tideserve gateway --prefill http://127.0.0.1:30001 8998 --decode http://127.0.0.1:30002

  # P/D with vLLM's hand-off (prefill max_tokens=1, then decode with kv_transfer_params)
  tideserve gateway --prefill http://127.0.0.1:30001 --decode http://127.0.0.1:30002 \
      --pd-protocol vllm

  # spans of every request to an OpenTelemetry collector (one trace: gateway, kvmeta, engine)
  tideserve gateway --endpoints URL... --trace-exporter otlp --otlp-endpoint localhost:4317

  # two active-active replicas sharing prefix affinity and load through Redis (request
  # records go to ts:requests), with precise prefix data from kvmeta
  tideserve gateway --port 8000 --endpoints URL... --redis-url redis://127.0.0.1:6379/0 \
      --share-state --replica-id a --kvmeta-address 127.0.0.1:50052

  # API keys: tenant and SLO classes from each client's key, per-tenant rate limits
  tideserve keys create --tenant acme --rpm 600 --postgres-url postgresql://u:p@db/ts
  tideserve gateway --endpoints URL... --api-keys --postgres-url postgresql://u:p@db/ts \
      --redis-url redis://127.0.0.1:6379/0

  # one gateway process per core on port 8000 (--gateways auto with --share-state; one
  # process saturates one core), sharing routing state through Redis
  tideserve gateway --port 8000 --endpoints URL... --redis-url redis://127.0.0.1:6379/0 \
      --share-state

profiles shipped: default, agent, slo, tpot-guard, round_robin, least_load, power_of_two,
cache_aware (services/common/routing/default_profiles.yaml; --profiles-file FILE for your own).
request metadata headers: X-Tideserve-Class, X-Tideserve-Tenant, X-Tideserve-Session,
X-Tideserve-Session-Final, X-Tideserve-Deadline-Ms, X-Tideserve-Profile (agents' own session
headers too: docs/agents.md).
"""


# The flags of `tideserve gateway`, in --help order.
_GATEWAY_FLAGS: tuple[Flag, ...] = (
    flag("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1)"),
    flag("--port", type=int, default=8000, help="HTTP port (default 8000; 0 = free)"),
    flag("--endpoints", nargs="+", default=[], metavar="URL", help="engines: URL or ROLE=URL"),
    flag(
        "--prefill",
        nargs="+",
        action="append",
        default=[],
        metavar="URL [BOOTSTRAP_PORT]",
        help="a prefill engine and its bootstrap port (repeatable)",
    ),
    flag("--decode", action="append", default=[], metavar="URL", help="decode engine"),
    flag("--profile", default="", help="scheduler profile (default: 'default')"),
    flag("--profiles-file", default=None, help="profiles YAML (default: shipped)"),
    flag("--model", action="append", default=[], help="accepted model names"),
    flag("--block-size", type=int, default=64, help="prefix hashing block (default 64)"),
    flag(
        "--model-path",
        default=None,
        metavar="DIR",
        help="served model's directory (tokenizer.json, tokenizer_config.json): tokenize with "
        "its tokenizer and chat template (default: the simulator's whitespace tokenizer)",
    ),
    flag(
        "--hash-scheme",
        choices=["tideserve", "vllm", "sglang"],
        default="tideserve",
        help="block hashes as this engine kind computes them (default tideserve, the "
        "simulator's; vllm/sglang equal their KV events, with --model-path)",
    ),
    flag("--perf-profile", default="", help="perfmodel profile for TTFT cost"),
    flag("--retries", type=int, default=2, help="retries before the first byte"),
    flag(
        "--pd-protocol",
        choices=["sglang", "vllm"],
        default="sglang",
        help="P/D hand-off: sglang bootstrap (default) or vllm kv_transfer_params",
    ),
    flag(
        "--decode-can-prefill",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="decode engines can compute a prompt without a prefill peer (default: from "
        "--pd-protocol; sglang: no, so every request on a decode engine is disaggregated; "
        "vllm: yes)",
    ),
    flag(
        "--forward-authorization",
        action="store_true",
        help="pass the client's Authorization header on to the engines",
    ),
    flag(
        "--engine-api-key",
        default="",
        help="send 'Authorization: Bearer KEY' to the engines (started with --api-key)",
    ),
    flag("--no-preemption", action="store_true", help="never pre-empt lower classes"),
    flag(
        "--slo-config",
        default=None,
        metavar="FILE",
        help="YAML with slo_classes, default_slo_class and tenants, as in tideserve.yaml's "
        "scheduler section (a whole tideserve.yaml works; other keys are ignored)",
    ),
    flag(
        "--default-slo-class",
        default=None,
        help="SLO class of requests that name none (default: --slo-config's, else agent; "
        "shipped classes interactive: TTFT 2 s, agent: 10 s, batch: none; its TTFT target "
        "orders dispatch)",
    ),
    flag(
        "--dispatch-hold-ms",
        type=float,
        default=DISPATCH_HOLD_MS,
        help="hold picks for an engine with this much predicted prefill outstanding, and "
        "send them deadlines first, then shortest first (0 = off; default "
        f"{DISPATCH_HOLD_MS:g})",
    ),
    flag(
        "--dispatch-follow-ms",
        type=float,
        default=DISPATCH_FOLLOW_MS,
        help="hold a pick whose prefix an earlier pick is still computing on the same engine "
        "until that pick's first byte, at most this long, so that it hits the prefix "
        f"(0 = off; default {DISPATCH_FOLLOW_MS:g})",
    ),
    flag(
        "--dispatch-protect",
        choices=("off", "guard", "slack", "auto"),
        default="off",
        help="while an engine serves a request that can still meet its TTFT (until its first "
        "byte), hold other prompts for it, each at most its class's starve_after_ms (guard: "
        "every prompt but the smallest; slack: those longer than the guards' predicted slack; "
        "auto: guard while the fleet is overloaded; default off)",
    ),
    flag(
        "--dispatch-protect-when-missed",
        type=float,
        default=DISPATCH_PROTECT_WHEN_MISSED,
        help="--dispatch-protect auto: protect while at least this share of the recent "
        "requests were predicted to miss their TTFT target when offered "
        f"(default {DISPATCH_PROTECT_WHEN_MISSED:g})",
    ),
    flag("--max-in-flight", type=int, default=256, help="per engine (default 256)"),
    flag("--seed", type=int, default=0, help="routing RNG seed"),
    flag("--log-level", default="WARNING", help="DEBUG, INFO, WARNING, ERROR"),
    flag("--deployment", default="default", help="deployment name (stream names)"),
    flag("--redis-url", default="", help="Redis for request records / shared state"),
    flag("--stream-prefix", default="ts", help="Redis stream name prefix"),
    flag("--share-state", action="store_true", help="active-active via --redis-url"),
    flag("--replica-id", default="", help="this replica's id (default generated)"),
    flag("--no-records", action="store_true", help="no RequestRecord per request"),
    flag(
        "--api-keys",
        action="store_true",
        help="require API keys (tideserve keys create; stored in --postgres-url); rate limits "
        "shared through --redis-url",
    ),
    flag(
        "--postgres-url",
        default="",
        help="Postgres holding the API keys and the stored responses (Responses API)",
    ),
    flag(
        "--responses-retention",
        type=float,
        default=30 * 86400.0,
        metavar="S",
        help="stored responses are kept this many seconds (default 30 days)",
    ),
    flag("--kvmeta-address", default="", help="kvmeta gRPC host:port (MatchPrefix)"),
    flag(
        "--native-apis",
        nargs="+",
        choices=["messages", "responses"],
        default=[],
        metavar="API",
        help="APIs the engines serve themselves, forwarded as sent (vLLM serves "
        "/v1/messages and /v1/responses); default: translated to chat completions and back",
    ),
    flag(
        "--record-tool-contents",
        action="store_true",
        help="agent tool calls on record with their contents, not only names and sizes",
    ),
    flag(
        "--trace-exporter",
        choices=["none", "console", "otlp"],
        default="none",
        help="where OpenTelemetry spans go (default none: trace ids and traceparent only)",
    ),
    flag(
        "--otlp-endpoint",
        default=None,
        metavar="URL",
        help="OTLP/gRPC collector: host:port, http://... (plaintext) or https://... (TLS)",
    ),
    flag("--otlp-ca-file", default=None, metavar="PEM", help="CA of the collector"),
    flag("--trace-sample-ratio", type=float, default=1.0, help="new traces recorded (default 1)"),
    flag(
        "--telemetry-address",
        default="",
        help="telemetry gRPC host:port: price TTFT with its fitted model (GetPerfModel)",
    ),
    flag("--perf-model-refresh", type=float, default=10.0, help="GetPerfModel period (s)"),
    flag(
        "--perf-model-min-confidence",
        type=float,
        default=0.5,
        help="fit confidence from which it replaces --perf-profile (default 0.5)",
    ),
    flag(
        "--gateways",
        type=parse_gateway_count,
        default="auto",
        metavar="N|auto",
        help="gateway processes on --port (SO_REUSEPORT; one saturates one core). Default "
        "auto: one per usable core with --share-state (replicas share routing state through "
        "--redis-url), else 1",
    ),
    flag(
        "--event-loop",
        choices=["uvloop", "asyncio"],
        default="uvloop",
        help="asyncio event loop implementation (default uvloop: less CPU per request)",
    ),
)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "gateway",
        help="run the OpenAI-compatible gateway standalone in front of engines",
        description="KV-cache-, SLO- and P/D-aware OpenAI-compatible gateway over static "
        "engine endpoints (health-checked, load-scraped).",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_flags(p, _GATEWAY_FLAGS)
    p.set_defaults(func=run)


def _endpoints(args: argparse.Namespace) -> list[str]:
    """The engine flags as ``SchedulerSettings.endpoints`` entries."""
    from services.scheduler.settings import parse_endpoint

    out: list[str] = list(args.endpoints)
    for entry in args.prefill:
        if len(entry) > 2:
            raise ValueError(f"--prefill takes URL [BOOTSTRAP_PORT], got {entry}")
        url = parse_endpoint(entry[0])[2]
        port = int(entry[1]) if len(entry) == 2 and entry[1].lower() != "none" else 0
        out.append(f"prefill={url}" + (f"#bootstrap={port}" if port else ""))
    out += [f"decode={parse_endpoint(item)[2]}" for item in args.decode]
    if not out:
        raise ValueError("no engines: give --endpoints, or --prefill and --decode")
    return out


def settings_from_args(args: argparse.Namespace) -> SchedulerSettings:
    """The flags as the scheduler's settings (no file, no env: flags and defaults only).
    ValueError (one line) for bad flags."""
    from pydantic import ValidationError

    from services.scheduler.settings import SchedulerSettings

    values = {
        "host": args.host,
        "endpoints": _endpoints(args),
        "profile": args.profile,
        "profiles_file": args.profiles_file,
        "models": args.model,
        "block_size": args.block_size,
        "perf_profile": args.perf_profile,
        "model_path": args.model_path,
        "hash_scheme": args.hash_scheme,
        "retries": args.retries,
        "pd_protocol": args.pd_protocol,
        "decode_can_prefill": args.decode_can_prefill,
        "preemption": not args.no_preemption,
        "dispatch_hold_ms": args.dispatch_hold_ms,
        "dispatch_follow_ms": args.dispatch_follow_ms,
        "dispatch_protect": args.dispatch_protect,
        "dispatch_protect_when_missed": args.dispatch_protect_when_missed,
        "forward_authorization": args.forward_authorization,
        "engine_api_key": args.engine_api_key,
        "max_in_flight_per_endpoint": args.max_in_flight,
        "seed": args.seed,
        "deployment": args.deployment,
        "redis_url": args.redis_url or None,
        "stream_prefix": args.stream_prefix,
        "share_state": args.share_state,
        "replica_id": args.replica_id,
        "request_records": not args.no_records,
        "api_keys": args.api_keys,
        "postgres_url": args.postgres_url or None,
        "kvmeta_address": args.kvmeta_address,
        "record_tool_contents": args.record_tool_contents,
        "native_apis": args.native_apis,
        "responses_retention_s": args.responses_retention,
        "trace_exporter": args.trace_exporter,
        "otlp_endpoint": args.otlp_endpoint,
        "otlp_ca_file": args.otlp_ca_file,
        "trace_sample_ratio": args.trace_sample_ratio,
        "telemetry_address": args.telemetry_address,
        "perf_model_refresh_s": args.perf_model_refresh,
        "perf_model_min_confidence": args.perf_model_min_confidence,
    }
    if args.slo_config:
        values.update(slo_file_values(args.slo_config))
    if args.default_slo_class:
        values["default_slo_class"] = args.default_slo_class
    try:
        return SchedulerSettings.model_validate(values)
    except ValidationError as err:
        e = err.errors()[0]
        where = ".".join(str(x) for x in e["loc"])
        msg = str(e["msg"]).removeprefix("Value error, ")
        raise ValueError(f"{where}: {msg}" if where else msg) from None


SLO_KEYS = ("slo_classes", "default_slo_class", "tenants")


def slo_file_values(path: str) -> dict[str, object]:
    """The SLO keys of a YAML file (``--slo-config``): its ``scheduler`` section when it has
    one (a tideserve.yaml), else the top level. ValueError (one line) when it cannot be read
    or is not a mapping."""
    import yaml

    try:
        doc = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as err:
        raise ValueError(f"--slo-config {path}: {str(err).splitlines()[0]}") from None
    if isinstance(doc, dict) and isinstance(doc.get("scheduler"), dict):
        doc = doc["scheduler"]
    if not isinstance(doc, dict):
        raise ValueError(f"--slo-config {path}: expected a mapping with slo_classes")
    return {k: doc[k] for k in SLO_KEYS if k in doc}


def processes(gateways: GatewayCount, *, share_state: bool, port: int, cores: int) -> int:
    """How many gateway processes to run (pure): ``auto`` is one per usable core when the
    replicas share routing state (``--share-state``), else one (independent replicas would
    each learn their own prefix affinity and load); a number is itself. Several processes
    need a fixed port (they all listen on it, SO_REUSEPORT). ValueError for a number with
    port 0."""
    if gateways == "auto":
        return gateway_count("auto", cores) if share_state and port else 1
    if gateways > 1 and not port:
        raise ValueError(f"--gateways {gateways} needs a fixed --port (they share it)")
    return gateways


def run(args: argparse.Namespace) -> int:
    from services.common.errors import StartupError

    try:
        settings = settings_from_args(args)
        count = processes(
            args.gateways,
            share_state=settings.share_state,
            port=args.port,
            cores=len(os.sched_getaffinity(0)),
        )
        if settings.redis_url or settings.postgres_url:
            from services.common.server import check_dependencies

            # reach them; migrate the scheduler schema (the API keys' table)
            asyncio.run(check_dependencies(settings, "scheduler"))
    except (ValueError, StartupError, ConnectionError) as err:
        print(f"tideserve gateway: {str(err).splitlines()[0]}", file=sys.stderr)
        return 2
    if count > 1 and not settings.share_state:
        print(
            f"tideserve gateway: {count} processes without --share-state: each routes with "
            "its own prefix and load state",
            file=sys.stderr,
        )
    # Text lines on stderr; a request's lines carry its trace id and request id.
    from services.common.logs import configure_logging

    configure_logging(args.log_level, "text", "gateway")
    # Replicas 2..N are forked before any event loop, thread or connection exists; each
    # builds its own scheduler and stops when the first process goes away.
    children: list[int] = []
    parent = os.getpid()
    for k in range(1, count):
        pid = os.fork()
        if pid == 0:
            os._exit(_replica(args, _replica_settings(settings, k), count > 1, parent))
        children.append(pid)
    try:
        return _replica(args, _replica_settings(settings, 0), count > 1, None)
    except StartupError:
        return 2
    finally:
        for pid in children:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGTERM)
        for pid in children:
            with contextlib.suppress(OSError):
                os.waitpid(pid, 0)


def _replica_settings(settings: SchedulerSettings, k: int) -> SchedulerSettings:
    """Replica ``k``'s settings: an explicit replica id gets ``-<k+1>`` from the second on."""
    if k == 0 or not settings.replica_id:
        return settings
    return settings.model_copy(update={"replica_id": f"{settings.replica_id}-{k + 1}"})


def _replica(
    args: argparse.Namespace, settings: SchedulerSettings, reuse: bool, parent: int | None
) -> int:
    """Serve one gateway process until a signal (or, ``parent`` given, until that process
    is gone); 2 when it cannot start."""
    from services.common.errors import StartupError

    try:
        runtime.run(_serve(settings, args.host, args.port, reuse, parent), args.event_loop)
    except StartupError as err:
        print(f"tideserve gateway: {err}", file=sys.stderr)
        return 2
    return 0


async def _serve(
    settings: SchedulerSettings, host: str, port: int, reuse: bool, parent: int | None
) -> None:
    # Built inside the running loop: its gRPC aio channels (kvmeta, autoscaler, telemetry)
    # bind to the loop that is current when they are created.
    from services.scheduler.compose import Scheduler

    scheduler = Scheduler(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    watch = _watch_parent(parent, stop) if parent is not None else None
    try:
        await scheduler.start((host, port, reuse), settle_heap=True)
        await stop.wait()
    finally:
        if watch is not None:
            loop.remove_reader(watch)
            os.close(watch)
        await scheduler.stop()


def _watch_parent(parent: int, stop: asyncio.Event) -> int | None:
    """Set ``stop`` when process ``parent`` exits (its pidfd becomes readable); the fd to
    close, None when it is already gone."""
    try:
        fd = os.pidfd_open(parent)
    except ProcessLookupError:
        stop.set()
        return None
    asyncio.get_running_loop().add_reader(fd, stop.set)
    return fd
