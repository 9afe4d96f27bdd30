"""CLI verbs of the local stack: ``up``, ``down``, ``status`` (registered by services.cli)."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from services.stack.plan import SERVICES, ChildSpec, build_service_children, choose_ports

if TYPE_CHECKING:
    from services.common.settings import ServiceSettings

_UP_EXAMPLES = """\
examples:
  tideserve up                                  # embedded Postgres + Redis, default ports
  tideserve up --state-dir /tmp/ts --base-port-offset 100
  tideserve up --postgres-url postgresql://u:p@db:5432/ts --redis-url redis://cache:6379/0
  tideserve up --config tideserve.yaml --json   # print the endpoints as JSON once SERVING

Ports (before --base-port-offset): gRPC scheduler 50051, kvmeta 50052, autoscaler 50053,
telemetry 50054; metrics 9101-9104; gateway HTTP 8000; kvmeta TE metadata HTTP 8081;
embedded Redis 6380. Per-service keys in the config file (`kvmeta: {grpc_port: N}`,
`metrics_port`, `http_port`, `metadata_http_port`) and `stack: {redis_port: N}` override
them. Only endpoints that answer are printed.
Logs: <state-dir>/logs/<service>.log. Ctrl-C or `tideserve down` stops everything.
"""

_DOWN_EXAMPLES = """\
examples:
  tideserve down                      # stop the stack started by `tideserve up`
  tideserve down --state-dir /tmp/ts  # the stack whose state lives in /tmp/ts
"""

_STATUS_EXAMPLES = """\
examples:
  tideserve status
  tideserve status --state-dir /tmp/ts --json

Exit code 0 only when every service answers grpc.health SERVING.
"""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``up``, ``down`` and ``status`` to the top-level parser."""
    fmt = argparse.RawDescriptionHelpFormatter
    up = subparsers.add_parser(
        "up",
        help="start the local stack and stay in the foreground",
        description="Start Postgres, Redis (embedded unless URLs are given) and the four "
        "services as local processes; wait until all are SERVING; stop on Ctrl-C/SIGTERM.",
        epilog=_UP_EXAMPLES,
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
    up.set_defaults(func=cmd_up)

    down = subparsers.add_parser(
        "down",
        help="stop the local stack",
        description="Signal the running `tideserve up` to stop and wait until every process "
        "it recorded is gone (leftovers are killed after a timeout).",
        epilog=_DOWN_EXAMPLES,
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
        description="For each service: address, pid alive, grpc.health status, metrics URL.",
        epilog=_STATUS_EXAMPLES,
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
    """Settings + flags → (UpOptions, service children). Raises SettingsError / ValueError."""
    from services.common.settings import load_settings
    from services.stack.plan import shift_port
    from services.stack.settings import StackSettings
    from services.stack.up import UpOptions

    config = str(Path(args.config).expanduser().resolve()) if args.config else None
    stack = load_settings(
        StackSettings,
        "stack",
        config,
        {
            "postgres_url": args.postgres_url,
            "redis_url": args.redis_url,
            "state_dir": args.state_dir,
            "start_timeout_s": args.start_timeout,
        },
    )
    configured: dict[str, dict[str, int]] = {}
    for spec in SERVICES:
        svc = load_settings(_settings_class(spec.name), spec.name, config, {})
        configured[spec.name] = {
            pd.setting: int(getattr(svc, pd.setting))
            for pd in spec.ports
            if pd.setting in svc.model_fields_set
        }
    offset = int(args.base_port_offset)
    ports = choose_ports(configured, offset)
    state_dir = Path(stack.state_dir).expanduser().resolve()
    opts = UpOptions(
        state_dir=state_dir,
        host=stack.host,
        postgres_url=stack.postgres_url,
        redis_url=stack.redis_url,
        redis_port=shift_port(stack.redis_port, offset, "stack.redis_port"),
        start_timeout_s=stack.start_timeout_s,
        stop_timeout_s=stack.stop_timeout_s,
        json_output=bool(args.json),
    )
    children = build_service_children(
        ports=ports,
        host=stack.host,
        state_dir=state_dir,
        config_path=config,
        base_env=os.environ,
    )
    return opts, children


def cmd_up(args: argparse.Namespace) -> int:
    from services.common.settings import SettingsError
    from services.stack.up import StackRunner, default_infra

    try:
        opts, children = resolve_up(args)
    except (SettingsError, ValueError) as exc:
        return _fail("up", str(exc), 2)
    return StackRunner(opts, children, default_infra()).run()


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
    from services.common.settings import SettingsError
    from services.stack.control import all_serving, collect_status, print_status, status_report
    from services.stack.state import read_state

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
    print_status(status_report(state, statuses), sys.stdout, args.json)
    return 0 if all_serving(statuses) else 1
