"""What the local stack runs, on which ports: pure, no I/O.

A plan is a list of :class:`ChildSpec` (one per process the supervisor starts). The four
services come from :data:`SERVICES`; later kinds of children (simulated engines) are more
specs appended to the same list, so the supervisor never needs to know what it runs.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from services.common.local.spec import ChildSpec, PortClaim
from services.stack.gateways import (
    GATEWAY_SERVICE,
    GatewayReplicas,
    replica_env,
    replica_names,
    replica_ports,
)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_REDIS_PORT = 6380
"""Embedded Redis: one above the standard port so it never fights a system Redis."""


@dataclass(frozen=True)
class PortDefault:
    """A port setting of a service: settings field, what it is, design default, and the URL
    path printed for it (None: not HTTP)."""

    setting: str
    purpose: str
    default: int
    path: str | None = None


@dataclass(frozen=True)
class ServiceDefaults:
    """A service's design defaults (see the design's Defaults table)."""

    name: str
    grpc_service: str
    ports: tuple[PortDefault, ...]

    def port(self, setting: str) -> PortDefault:
        return next(p for p in self.ports if p.setting == setting)


def _svc(
    name: str, grpc_service: str, grpc: int, metrics: int, *extra: PortDefault
) -> ServiceDefaults:
    return ServiceDefaults(
        name,
        grpc_service,
        (
            PortDefault("grpc_port", "gRPC", grpc),
            PortDefault("metrics_port", "metrics", metrics, "/metrics"),
            *extra,
        ),
    )


SERVICES: tuple[ServiceDefaults, ...] = (
    _svc(
        "scheduler",
        "tideserve.v1.SchedulerService",
        50051,
        9101,
        PortDefault("http_port", "gateway", 8000, "/v1"),
    ),
    _svc(
        "kvmeta",
        "tideserve.v1.KVMetaService",
        50052,
        9102,
        PortDefault("metadata_http_port", "TE metadata", 8081, "/metadata"),
    ),
    _svc("autoscaler", "tideserve.v1.AutoscalerService", 50053, 9103),
    _svc("telemetry", "tideserve.v1.TelemetryService", 50054, 9104),
)
SERVICE_NAMES: tuple[str, ...] = tuple(s.name for s in SERVICES)


def choose_ports(
    configured: Mapping[str, Mapping[str, int]], offset: int = 0
) -> dict[str, dict[str, int]]:
    """Ports per service and setting: configured values (``{"kvmeta": {"grpc_port": N}}``)
    else the design defaults, plus ``offset`` on every non-zero port. A port of 0 stays 0 (the
    endpoint is off); gRPC cannot be off.

    Raises ValueError naming the setting when a resulting port is outside 1..65535.
    """
    out: dict[str, dict[str, int]] = {}
    for svc in SERVICES:
        conf = configured.get(svc.name, {})
        chosen: dict[str, int] = {}
        for pd in svc.ports:
            value = conf.get(pd.setting, pd.default)
            what = f"{svc.name}.{pd.setting}"
            if value == 0 and pd.setting != "grpc_port":
                chosen[pd.setting] = 0
            else:
                chosen[pd.setting] = _shift(value, offset, what)
        out[svc.name] = chosen
    return out


def shift_port(port: int, offset: int, what: str) -> int:
    """``port + offset``; ValueError naming ``what`` when out of range."""
    return _shift(port, offset, what)


def _shift(port: int, offset: int, what: str) -> int:
    shifted = port + offset
    if not 1 <= shifted <= 65535:
        raise ValueError(f"{what}: port {port} + offset {offset} = {shifted} is outside 1..65535")
    return shifted


def service_env(
    base: Mapping[str, str],
    *,
    host: str,
    ports: Mapping[str, int],
    state_dir: Path,
    config_path: str | None,
) -> dict[str, str]:
    """The environment of a service child: ``base`` plus TIDESERVE_HOST, one
    ``TIDESERVE_<SETTING>`` per port setting, TIDESERVE_STATE_DIR and TIDESERVE_CONFIG.

    The database URLs are not known yet when the plan is made; ``up`` adds
    TIDESERVE_POSTGRES_URL / TIDESERVE_REDIS_URL when it starts the child.
    """
    env = dict(base)
    env["TIDESERVE_HOST"] = host
    for setting, port in ports.items():
        env[f"TIDESERVE_{setting.upper()}"] = str(port)
    env["TIDESERVE_STATE_DIR"] = str(state_dir)
    env["PYTHONUNBUFFERED"] = "1"
    if config_path is not None:
        env["TIDESERVE_CONFIG"] = config_path
    return env


def reachable(host: str) -> str:
    """An address that reaches a server bound to ``host`` (bound everywhere: loopback)."""
    return "127.0.0.1" if host in ("0.0.0.0", "::", "") else host


def telemetry_address(ports: Mapping[str, Mapping[str, int]], host: str) -> str:
    """The stack's telemetry gRPC address as its peers dial it."""
    return f"{reachable(host)}:{ports['telemetry']['grpc_port']}"


def autoscaler_env(
    ports: Mapping[str, Mapping[str, int]], host: str, gateways: Sequence[Mapping[str, int]]
) -> dict[str, str]:
    """Where the stack's autoscaler finds its peers (pure): the telemetry service it plans
    from, every gateway replica's gRPC address for ``Drain`` before a scale-in, and kvmeta,
    which migrates a drained instance's agent sessions and reports their KV per instance."""
    host = reachable(host)
    grpc_of = [f"{host}:{g['grpc_port']}" for g in gateways]
    return {
        "TIDESERVE_AUTOSCALER__TELEMETRY_ADDRESS": telemetry_address(ports, host),
        "TIDESERVE_AUTOSCALER__DRIVER__SCHEDULER_ADDRESSES": json.dumps(grpc_of),
        "TIDESERVE_AUTOSCALER__DRIVER__KVMETA_ADDRESS": f"{host}:{ports['kvmeta']['grpc_port']}",
    }


def scheduler_env(ports: Mapping[str, Mapping[str, int]], host: str) -> dict[str, str]:
    """Where the stack's gateway replicas find telemetry (pure): its fitted performance model
    prices their predicted TTFT once confident (GetPerfModel)."""
    return {"TIDESERVE_SCHEDULER__TELEMETRY_ADDRESS": telemetry_address(ports, host)}


def kvmeta_env(ports: Mapping[str, Mapping[str, int]], host: str) -> dict[str, str]:
    """Where the stack's kvmeta finds telemetry (pure): its tool times are the session
    predictor's priors (GetToolTimes) until kvmeta's own distributions are confident."""
    return {"TIDESERVE_KVMETA__TELEMETRY_ADDRESS": telemetry_address(ports, host)}


def build_service_children(
    *,
    ports: Mapping[str, Mapping[str, int]],
    host: str,
    state_dir: Path,
    config_path: str | None,
    base_env: Mapping[str, str],
    python: str = sys.executable,
    gateways: GatewayReplicas | None = None,
) -> tuple[ChildSpec, ...]:
    """One :class:`ChildSpec` per service: ``python -m services.<svc> --grpc-port N``, its
    other ports in the environment, output to ``<state_dir>/logs/<name>.log``. The scheduler
    is ``gateways.count`` replicas (services.stack.gateways; ValueError from its port plan
    passes through)."""
    gw = gateways if gateways is not None else GatewayReplicas()
    children = []
    for svc in SERVICES:
        plans: list[tuple[str, dict[str, int], dict[str, str]]]
        if svc.name == "autoscaler":
            extra_env = autoscaler_env(ports, host, replica_ports(ports[GATEWAY_SERVICE], gw))
            plans = [(svc.name, dict(ports[svc.name]), extra_env)]
        elif svc.name == "kvmeta":
            plans = [(svc.name, dict(ports[svc.name]), kvmeta_env(ports, host))]
        elif svc.name != GATEWAY_SERVICE:
            plans = [(svc.name, dict(ports[svc.name]), {})]
        else:
            names = replica_names(gw.count)
            per = replica_ports(ports[svc.name], gw)
            to_telemetry = scheduler_env(ports, host)
            plans = [
                (n, p, {**replica_env(n, gw), **to_telemetry})
                for n, p in zip(names, per, strict=True)
            ]
        for name, chosen, extra in plans:
            children.append(
                _service_child(
                    svc,
                    name,
                    chosen,
                    host=host,
                    state_dir=state_dir,
                    config_path=config_path,
                    env={
                        **service_env(
                            base_env,
                            host=host,
                            ports=chosen,
                            state_dir=state_dir,
                            config_path=config_path,
                        ),
                        **extra,
                    },
                    python=python,
                    replica_of=svc.name if len(plans) > 1 else "",
                )
            )
    return tuple(children)


def _service_child(
    svc: ServiceDefaults,
    name: str,
    chosen: Mapping[str, int],
    *,
    host: str,
    state_dir: Path,
    config_path: str | None,
    env: Mapping[str, str],
    python: str,
    replica_of: str,
) -> ChildSpec:
    grpc_port = chosen["grpc_port"]
    argv = [python, "-m", f"services.{svc.name}", "--grpc-port", str(grpc_port)]
    if config_path is not None:
        argv += ["--config", config_path]
    claims = tuple(
        PortClaim(
            name,
            pd.purpose,
            host,
            chosen[pd.setting],
            pd.setting,
            pd.path,
            shared=bool(replica_of) and pd.setting == "http_port",
        )
        for pd in svc.ports
        if chosen[pd.setting]
    )
    return ChildSpec(
        name=name,
        argv=tuple(argv),
        env=env,
        log_path=state_dir / "logs" / f"{name}.log",
        grpc_address=f"{host}:{grpc_port}",
        grpc_service=svc.grpc_service,
        ports=claims,
        replica_of=replica_of,
    )


def duplicate_ports(claims: Sequence[PortClaim]) -> list[tuple[PortClaim, PortClaim]]:
    """Pairs of claims that want the same port (the first claimant, the later one). Claims
    that are all :attr:`PortClaim.shared` for the same setting on the same host are one
    deliberate shared listener, not a conflict."""
    seen: dict[int, PortClaim] = {}
    dups: list[tuple[PortClaim, PortClaim]] = []
    for claim in claims:
        first = seen.get(claim.port)
        if first is None:
            seen[claim.port] = claim
        elif not _share(first, claim):
            dups.append((first, claim))
    return dups


def _share(a: PortClaim, b: PortClaim) -> bool:
    return a.shared and b.shared and a.setting == b.setting and a.host == b.host
