"""CLI verbs of the local stack: ``up``, ``down``, ``status`` (registered by services.cli)."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from services.common.local.spec import ChildSpec
from services.common.tokens.hashing import DEFAULT_BLOCK_SIZE
from services.stack.cli_help import DOWN_EXAMPLES, STATUS_EXAMPLES, UP_EXAMPLES
from services.stack.gateways import GatewayReplicas, gateway_count, parse_gateway_count
from services.stack.plan import SERVICES, build_service_children, choose_ports
from services.stack.restarts import RestartPolicy

if TYPE_CHECKING:
    from services.common.settings import ServiceSettings
    from services.stack.engines import EngineFleet, RealEngine


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``up``, ``down`` and ``status`` to the top-level parser."""
    fmt = argparse.RawDescriptionHelpFormatter
    up = subparsers.add_parser(
        "up",
        help="start the local stack and stay in the foreground",
        description="Start Postgres, Redis (embedded unless URLs are given) and the four "
        "services as local processes; wait until all are SERVING; stop on Ctrl-C/SIGTERM.",
        epilog=UP_EXAMPLES,
        formatter_class=fmt,
    )
    _state_dir_arg(up)
    up.add_argument("--config", metavar="FILE", help="YAML settings file")
    up.add_argument("--postgres-url", metavar="URL", help="external Postgres (no embedded one)")
    up.add_argument("--redis-url", metavar="URL", help="external Redis (no embedded one)")
    up.add_argument(
        "--base-port-offset", type=int, default=0, metavar="N", help="add N to every port"
    )
    up.add_argument(
        "--start-timeout", type=float, metavar="S", help="seconds to wait for SERVING (60)"
    )
    up.add_argument("--json", action="store_true", help="print the endpoints as one JSON line")
    up.add_argument(
        "--insecure",
        action="store_true",
        help="no token auth and one store user for all (stack.secure: false)",
    )
    up.add_argument(
        "--gateways",
        type=parse_gateway_count,
        metavar="N|auto",
        help="N scheduler/gateway replicas sharing the gateway address and routing state "
        "(default auto: one per usable core)",
    )
    eng = up.add_argument_group("simulated engines (the gateway routes to them)")
    eng.add_argument(
        "--engines",
        type=int,
        metavar="N",
        help="N aggregated engines (default 2, none with --prefill/--decode or the "
        "scheduler's own endpoints; 0: none)",
    )
    eng.add_argument("--prefill", type=int, metavar="N", help="N prefill engines (P/D mode)")
    eng.add_argument("--decode", type=int, metavar="M", help="M decode engines (P/D mode)")
    eng.add_argument(
        "--engine-profile", metavar="NAME", help="engine performance profile (engine default)"
    )
    eng.add_argument(
        "--engine-speedup", type=float, metavar="X", help="engines run X times faster (1)"
    )
    eng.add_argument("--engine-kv-blocks", type=int, metavar="N", help="KV blocks per engine")
    eng.add_argument(
        "--engine-arg",
        action="append",
        metavar="ARGS",
        help="more arguments for every engine (repeatable; write "
        "--engine-arg=--flag=value or quote: --engine-arg '--flag value')",
    )
    real = up.add_argument_group("real engines (vLLM or SGLang serving a model directory)")
    real.add_argument("--engine", choices=("sim", "vllm", "sglang"), help="engine kind (sim)")
    real.add_argument("--model-path", metavar="DIR", help="the model the engines serve")
    real.add_argument("--model-name", metavar="NAME", help="served name (the directory's)")
    real.add_argument(
        "--engine-command",
        metavar="CMD",
        help="the engine server's command (default `vllm serve`, `python -m "
        "sglang.launch_server`), e.g. '/opt/vllm/bin/python -m vllm.entrypoints.openai.api_server'",
    )
    up.set_defaults(func=cmd_up)

    down = subparsers.add_parser(
        "down",
        help="stop the local stack",
        description="Signal the running `tideserve up` to stop and wait until every process "
        "it recorded is gone (leftovers are killed after a timeout).",
        epilog=DOWN_EXAMPLES,
        formatter_class=fmt,
    )
    _state_dir_arg(down)
    down.add_argument(
        "--timeout", type=float, default=60.0, metavar="S", help="wait for `up` (default 60)"
    )
    down.set_defaults(func=cmd_down)

    status = subparsers.add_parser(
        "status",
        help="health of each service of the local stack",
        description="For each service: address, pid alive, grpc.health status, metrics URL; "
        "for each engine: URL, role, pid alive, HTTP health.",
        epilog=STATUS_EXAMPLES,
        formatter_class=fmt,
    )
    _state_dir_arg(status)
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.set_defaults(func=cmd_status)


def _state_dir_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--state-dir", metavar="DIR", help="state directory (default ~/.local/share/tideserve)"
    )


def _fail(verb: str, msg: str, code: int) -> int:
    print(f"tideserve {verb}: {msg}", file=sys.stderr)
    return code


def _state_dir(args: argparse.Namespace) -> Path:
    """``--state-dir``, else the settings' state_dir (env / tideserve.yaml / default)."""
    from services.common.settings import load_settings
    from services.stack.settings import StackSettings

    settings = load_settings(StackSettings, "stack", None, {"state_dir": args.state_dir})
    return Path(settings.state_dir).expanduser().resolve()


def _settings_class(service: str) -> type[ServiceSettings]:
    """The service's own settings class (``services.<svc>.settings``), so its config section
    and defaults are read exactly as the service will read them."""
    from services.common.settings import ServiceSettings

    module = importlib.import_module(f"services.{service}.settings")
    for value in vars(module).values():
        if (
            isinstance(value, type)
            and issubclass(value, ServiceSettings)
            and value is not ServiceSettings
            and value.__module__ == module.__name__
        ):
            return value
    raise ValueError(f"services.{service}.settings defines no ServiceSettings subclass")


def resolve_up(args: argparse.Namespace) -> tuple[Any, tuple[ChildSpec, ...]]:
    """Settings + flags → (UpOptions with the engines' deployment, the service children).
    Raises SettingsError / ValueError (one line)."""
    from services.stack.deployment import engine_port_claims, stack_deployment
    from services.stack.plan import reachable, shift_port
    from services.stack.up import UpOptions

    config = str(Path(args.config).expanduser().resolve()) if args.config else None
    stack = _stack_settings(args, config)
    configured, scheduler, autoscaler = _service_settings(config)
    offset = int(args.base_port_offset)
    ports = choose_ports(configured, offset)
    state_dir = Path(stack.state_dir).expanduser().resolve()
    te_port = ports["kvmeta"]["metadata_http_port"]
    te_url = f"http://{reachable(stack.host)}:{te_port}/metadata" if te_port else None
    fleet = _fleet(stack, scheduler, offset, te_url)
    deployment = stack_deployment(fleet)
    opts = UpOptions(
        state_dir=state_dir,
        host=stack.host,
        postgres_url=stack.postgres_url,
        redis_url=stack.redis_url,
        redis_port=shift_port(stack.redis_port, offset, "stack.redis_port"),
        start_timeout_s=stack.start_timeout_s,
        stop_timeout_s=stack.stop_timeout_s,
        json_output=bool(args.json),
        deployment=deployment,
        autoscaler_address=f"{reachable(stack.host)}:{ports['autoscaler']['grpc_port']}",
        engine_claims=engine_port_claims(fleet, stack.host),
        engines_timeout_s=fleet.real.startup_timeout_s if fleet.real else None,
        stream_prefix=stack.stream_prefix,
        restarts=RestartPolicy(max_restarts=stack.service_restarts),
    )
    services = build_service_children(
        ports=ports,
        host=stack.host,
        state_dir=state_dir,
        config_path=config,
        base_env=os.environ,
        gateways=_gateway_replicas(stack, scheduler),
    )
    services = _wire_engines(services, stack, scheduler, fleet, ports, opts.autoscaler_address)
    if deployment is not None:  # the autoscaler runs the engines with its local driver
        services = _wire_driver(services, stack, autoscaler, fleet, state_dir)
    if stack.secure:  # last: flags refused above leave no state dir behind
        opts, services = _secure(opts, services, fleet)
    return opts, services


def _stack_settings(args: argparse.Namespace, config: str | None) -> Any:
    """The stack's own settings (``stack:`` section, env, then ``up``'s flags)."""
    from services.common.settings import load_settings
    from services.stack.settings import StackSettings

    engine_args = getattr(args, "engine_arg", None)
    return load_settings(
        StackSettings,
        "stack",
        config,
        {
            "postgres_url": args.postgres_url,
            "redis_url": args.redis_url,
            "state_dir": args.state_dir,
            "start_timeout_s": args.start_timeout,
            "engines": getattr(args, "engines", None),
            "prefill": getattr(args, "prefill", None),
            "decode": getattr(args, "decode", None),
            "engine_profile": getattr(args, "engine_profile", None),
            "engine_speedup": getattr(args, "engine_speedup", None),
            "engine_kv_blocks": getattr(args, "engine_kv_blocks", None),
            "engine_args": list(engine_args) if engine_args else None,
            "engine": getattr(args, "engine", None),
            "model_path": getattr(args, "model_path", None),
            "model_name": getattr(args, "model_name", None),
            "engine_command": getattr(args, "engine_command", None),
            "gateways": getattr(args, "gateways", None),
            "secure": False if getattr(args, "insecure", False) else None,
        },
    )


def _service_settings(config: str | None) -> tuple[dict[str, dict[str, int]], Any, Any]:
    """Each service's settings as it will read them: (the ports they set explicitly by
    service, the scheduler's settings, the autoscaler's)."""
    from services.common.settings import load_settings

    configured: dict[str, dict[str, int]] = {}
    scheduler: Any = None
    autoscaler: Any = None
    for spec in SERVICES:
        svc = load_settings(_settings_class(spec.name), spec.name, config, {})
        if spec.name == "scheduler":
            scheduler = svc
        if spec.name == "autoscaler":
            autoscaler = svc
        configured[spec.name] = {
            pd.setting: int(getattr(svc, pd.setting))
            for pd in spec.ports
            if pd.setting in svc.model_fields_set
        }
    return configured, scheduler, autoscaler


def _gateway_replicas(stack: Any, scheduler: Any) -> GatewayReplicas:
    """How many gateway replicas on which ports (``share_state`` on unless configured)."""
    return GatewayReplicas(
        count=gateway_count(stack.gateways, len(os.sched_getaffinity(0))),
        port_step=stack.gateway_port_step,
        grpc_ports=tuple(stack.gateway_grpc_ports),
        # on for replicas unless the configuration says otherwise
        share_state=bool(scheduler.share_state)
        if "share_state" in scheduler.model_fields_set
        else True,
    )


def _wire_engines(
    services: tuple[ChildSpec, ...],
    stack: Any,
    scheduler: Any,
    fleet: EngineFleet,
    ports: dict[str, dict[str, int]],
    autoscaler_address: str,
) -> tuple[ChildSpec, ...]:
    """The scheduler children told about the stack's engines (membership, perf profile,
    this stack's kvmeta for precise prefix scoring)."""
    from services.stack.engines import scheduler_engine_env, wire_scheduler

    perf = None
    if stack.engine_profile and "perf_profile" not in scheduler.model_fields_set:
        perf = stack.engine_profile
    wiring = scheduler_engine_env(fleet, autoscaler_address=autoscaler_address, perf_profile=perf)
    if wiring and fleet.real is not None:
        from services.stack.real_engines import scheduler_model_env

        wiring.update(scheduler_model_env(fleet.real))
    if wiring and "kvmeta_address" not in scheduler.model_fields_set:
        # Precise prefix scoring: the gateway asks this stack's kvmeta, which indexes the
        # engines' KV events from Redis.
        wiring["TIDESERVE_SCHEDULER__KVMETA_ADDRESS"] = (
            f"{stack.host}:{ports['kvmeta']['grpc_port']}"
        )
    return wire_scheduler(services, wiring)


def _wire_driver(
    services: tuple[ChildSpec, ...],
    stack: Any,
    autoscaler: Any,
    fleet: EngineFleet,
    state_dir: Path,
) -> tuple[ChildSpec, ...]:
    """The autoscaler child set up to run the stack's engines with its local driver."""
    from services.stack.deployment import autoscaler_driver_env
    from services.stack.engines import wire_scheduler

    driver_env = autoscaler_driver_env(
        fleet,
        host=stack.host,
        state_dir=state_dir,
        stop_grace_s=stack.stop_timeout_s,
        planner_configured="planner_enabled" in autoscaler.model_fields_set,
    )
    return wire_scheduler(services, driver_env, scheduler="autoscaler")


def _secure(
    opts: Any, services: tuple[ChildSpec, ...], fleet: EngineFleet
) -> tuple[Any, tuple[ChildSpec, ...]]:
    """The stack's secrets (made on first use) and token auth on every service child."""
    from services.stack.engines import wire_scheduler
    from services.stack.secure import auth_env, load_or_create

    secrets = load_or_create(opts.state_dir)
    opts = dataclasses.replace(opts, secrets=secrets)
    services = tuple(dataclasses.replace(c, env={**c.env, **auth_env(secrets)}) for c in services)
    if opts.deployment is not None:  # engines that talk to kvmeta present the services' token
        token = {"TIDESERVE_ENGINE_KVMETA_TOKEN_FILE": str(secrets.service_token_file)}
        services = wire_scheduler(services, token, scheduler="autoscaler")
    if fleet.data_plane:  # Mooncake's Transfer Engine sends no token to its metadata
        services = wire_scheduler(
            services, {"TIDESERVE_KVMETA__METADATA_HTTP_OPEN": "true"}, scheduler="kvmeta"
        )
    return opts, services


def _fleet(stack: Any, scheduler: Any, offset: int, te_metadata_url: str | None) -> EngineFleet:
    """The stack's engines from its settings (ValueError, one line, for a bad one)."""
    from services.common.perfmodel import get_profile
    from services.stack.engines import EngineFleet, default_workers, split_engine_args
    from services.stack.plan import shift_port

    real = _real_engine(stack)
    if stack.engine_profile is not None:
        try:
            get_profile(stack.engine_profile)
        except KeyError as exc:
            raise ValueError(f"--engine-profile: {str(exc).strip(chr(39))}") from None
    return EngineFleet(
        workers=default_workers(
            stack.engines,
            stack.prefill,
            stack.decode,
            static_endpoints="endpoints" in getattr(scheduler, "model_fields_set", ()),
        ),
        prefill=stack.prefill,
        decode=stack.decode,
        base_port=shift_port(stack.engine_base_port, offset, "stack.engine_base_port"),
        ports=tuple(stack.engine_ports),
        profile=stack.engine_profile,
        speedup=stack.engine_speedup,
        kv_blocks=stack.engine_kv_blocks,
        block_size=int(getattr(scheduler, "block_size", DEFAULT_BLOCK_SIZE)),
        deployment=str(getattr(scheduler, "deployment", "default")),
        extra_args=split_engine_args(stack.engine_args, *_reserved(stack.engine)),
        te_metadata_url=te_metadata_url,
        real=real,
        stream_prefix=stack.stream_prefix,
    )


def _reserved(kind: str) -> tuple[tuple[str, ...], str] | tuple[()]:
    """``split_engine_args``' reserved flags and kind for a real engine (the simulator's:
    its defaults)."""
    from services.stack.real_engines import RESERVED_FLAGS

    return (RESERVED_FLAGS[kind], kind) if kind in RESERVED_FLAGS else ()


def _real_engine(stack: Any) -> RealEngine | None:
    """The real engine kind the stack runs (None: the simulator); ValueError (one line)
    for a combination it cannot run."""
    import shlex

    from services.stack.engines import RealEngine
    from services.stack.real_engines import check_real_engine

    if stack.engine == "sim":
        return None
    path = stack.model_path
    engine = RealEngine(
        kind=stack.engine,
        model_path=str(Path(path).expanduser().resolve()) if path else "",
        model_name=stack.model_name or "",
        command=tuple(shlex.split(stack.engine_command)),
        startup_timeout_s=stack.engine_start_timeout_s,
        python=sys.executable,
    )
    sim_only = [
        name
        for name in ("engine_profile", "engine_speedup", "engine_kv_blocks")
        if getattr(stack, name) is not None
    ]
    check_real_engine(engine, prefill=stack.prefill, decode=stack.decode, sim_only=sim_only)
    if not Path(engine.model_path).is_dir():
        raise ValueError(f"--model-path {path}: not a directory")
    return engine


def cmd_up(args: argparse.Namespace) -> int:
    from services.common.security.channels import ClientSecurity
    from services.common.settings import SettingsError
    from services.stack.autoscaled import EngineOps
    from services.stack.up import StackRunner, default_infra

    try:
        opts, children = resolve_up(args)
    except (SettingsError, ValueError) as exc:
        return _fail("up", str(exc), 2)
    ops = EngineOps()
    if opts.secrets is not None:
        ops = EngineOps.secured(ClientSecurity(token=opts.secrets.admin_token()))
    infra = default_infra(opts.secrets, opts.stream_prefix)
    return StackRunner(opts, children, infra, engine_ops=ops).run()


def cmd_down(args: argparse.Namespace) -> int:
    from services.common.settings import SettingsError
    from services.stack.control import stack_down

    try:
        state_dir = _state_dir(args)
        result = stack_down(state_dir, up_timeout_s=args.timeout)
    except (SettingsError, ValueError) as exc:
        return _fail("down", str(exc), 2)
    if not result.was_running:
        print(f"no stack running (state dir {state_dir})")
        return 0
    if result.still_alive:
        return _fail("down", f"could not stop: {', '.join(result.still_alive)}", 1)
    extra = ""
    if result.orphans:
        extra += f"; stopped processes `up` left behind: {', '.join(result.orphans)}"
    if result.killed:
        extra += f"; killed after the grace period: {', '.join(result.killed)}"
    print(f"stack stopped (state dir {state_dir}){extra}")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from services.common.local.state import read_state
    from services.common.settings import SettingsError
    from services.stack.control import (
        all_serving,
        collect_engine_status,
        collect_status,
        print_status,
        status_report,
    )

    try:
        state_dir = _state_dir(args)
        state = read_state(state_dir)
    except (SettingsError, ValueError) as exc:
        return _fail("status", str(exc), 2)
    if state is None:
        if args.json:
            print_status(status_report(None, []), sys.stdout, True)
        else:
            print(f"no stack running (no state file in {state_dir})")
        return 1
    statuses = collect_status(state)
    engines = collect_engine_status(state)
    print_status(status_report(state, statuses, engines), sys.stdout, args.json)
    return 0 if all_serving(statuses, engines) else 1
