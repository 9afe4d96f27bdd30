"""``tideserve probe``: one health check of one process, for container health checks.

The image has no ``grpc_health_probe`` binary; this verb is it. A target is
``[grpc://]HOST:PORT`` (grpc.health.v1 Check, SERVING = healthy) or an ``http(s)://`` URL
(GET answering 2xx = healthy, e.g. a simulated engine's ``/health``). Without a target it
probes ``$TIDESERVE_PROBE`` if set, else gRPC ``127.0.0.1:$TIDESERVE_GRPC_PORT`` (the port the
service in this container serves), else the scheduler's default gRPC port (the image's default
command), so one ``HEALTHCHECK`` line fits every service. Exit 0 when healthy, 1 otherwise
(one line on stdout saying what was seen), 2 for an unusable target.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from services.common.security.channels import ClientSecurity
from services.common.settings import ServiceSettings, SettingsError, load_settings
from services.stack.health import Health, check_grpc_health, check_http_ready
from services.stack.plan import SERVICES

__all__ = ["ProbeTarget", "parse_target", "register"]

_EXAMPLES = """\
examples:
  tideserve probe                                 # gRPC 127.0.0.1:$TIDESERVE_GRPC_PORT (50051)
  tideserve probe 127.0.0.1:50052                 # grpc.health.v1 Check, whole server
  tideserve probe grpc://kvmeta:50052 --service tideserve.v1.KVMetaService
  tideserve probe http://127.0.0.1:30001/health   # an engine: GET answering 2xx

Exit code 0 only when the target is SERVING (gRPC) or answers 2xx (HTTP).
"""


@dataclass(frozen=True)
class ProbeTarget:
    """What to probe: ``kind`` grpc (``address`` = host:port) or http (``address`` = URL)."""

    kind: Literal["grpc", "http"]
    address: str


def parse_target(target: str | None, env: Mapping[str, str]) -> ProbeTarget:
    """The probe target from the argument, else ``TIDESERVE_PROBE``, else gRPC on
    ``127.0.0.1:$TIDESERVE_GRPC_PORT``, else on the scheduler's default gRPC port. ValueError
    with a clear message when it is unusable."""
    raw = (target or env.get("TIDESERVE_PROBE", "")).strip()
    if not raw:
        port = env.get("TIDESERVE_GRPC_PORT", "").strip() or str(_default_grpc_port())
        raw = f"127.0.0.1:{port}"
    if raw.startswith(("http://", "https://")):
        return ProbeTarget("http", raw)
    address = raw.removeprefix("grpc://")
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"target {raw!r}: expected HOST:PORT (port 1..65535) or an http(s) URL")
    return ProbeTarget("grpc", address)


def _default_grpc_port() -> int:
    return next(s for s in SERVICES if s.name == "scheduler").port("grpc_port").default


def _run(args: argparse.Namespace) -> int:
    try:
        target = parse_target(args.target, os.environ)
    except ValueError as exc:
        print(f"tideserve probe: {exc}")
        return 2
    if target.kind == "http":
        seen = check_http_ready(target.address, timeout_s=args.timeout)
    else:
        try:  # the process's own TLS settings (a server that needs TLS or a client certificate)
            security = ClientSecurity.of(load_settings(ServiceSettings, "probe"))
        except (SettingsError, ValueError) as exc:
            print(f"tideserve probe: {exc}")
            return 2
        seen = check_grpc_health(target.address, args.service, args.timeout, security)
    print(f"{target.kind} {target.address}: {seen.value}")
    return 0 if seen is Health.SERVING else 1


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "probe",
        help="one health check (container HEALTHCHECK)",
        description="One gRPC health check or HTTP GET; exit 0 when healthy.",
        epilog=_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("target", nargs="?", help="[grpc://]HOST:PORT or http(s)://URL")
    p.add_argument("--service", default="", help="gRPC service name ('' = the whole server)")
    p.add_argument("--timeout", type=float, default=2.0, help="seconds (default 2)")
    p.set_defaults(func=_run)
