"""Gateway replicas in the local stack (``tideserve up --gateways N|auto``). Pure: no I/O.

``auto`` (the default) is one replica per usable core (the scheduler's
:func:`~services.scheduler.replicas.gateway_count`, at most ``MAX_GATEWAYS``): one gateway
process is single-threaded and saturates one core (about 1,000-2,000 short requests per
second, benchmarks/README.md section 2), so the kernel's spreading over one process per
core is what uses the machine.

With N = 1 the stack runs one scheduler process, exactly as without this module. With N > 1
it runs N scheduler processes named ``scheduler``, ``scheduler-2``, ... ``scheduler-N``
(each serves gRPC ``SchedulerService`` and the OpenAI HTTP gateway) that share:

- one HTTP gateway address: every replica listens on the scheduler's ``http_port`` with
  ``http_reuse_port`` (Linux SO_REUSEPORT), so the kernel spreads new connections over the
  live replicas and stops sending to a dead one;
- routing state: ``share_state`` (routed prefixes and in-flight load over Redis, see
  services/scheduler/shared.py), each replica with its name as ``replica_id``.
  A ``share_state`` set explicitly in the configuration is kept (e.g. ``false`` to compare).

Every replica has its own gRPC and metrics port. Replica k (k = 0 for ``scheduler``) gets
the scheduler's port + k * ``port_step`` (default 100: gRPC 50051, 50151, 50251, ...;
metrics 9101, 9201, ...; both after ``--base-port-offset``; a metrics port of 0 stays off),
or, when given, explicit gRPC ports for ``scheduler-2`` .. ``scheduler-N`` (no offset).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from services.scheduler.replicas import (
    MAX_GATEWAYS,
    GatewayCount,
    gateway_count,
    parse_gateway_count,
)

__all__ = [
    "DEFAULT_GATEWAY_PORT_STEP",
    "GATEWAY_SERVICE",
    "MAX_GATEWAYS",
    "GatewayCount",
    "GatewayReplicas",
    "gateway_count",
    "parse_gateway_count",
    "replica_env",
    "replica_names",
    "replica_ports",
]

GATEWAY_SERVICE = "scheduler"
DEFAULT_GATEWAY_PORT_STEP = 100


@dataclass(frozen=True)
class GatewayReplicas:
    """What the user asked for: ``count`` replicas; ``grpc_ports`` (explicit, for replicas
    2..N in order) win over ``port_step``; ``share_state`` is what every replica gets when
    ``count`` > 1."""

    count: int = 1
    port_step: int = DEFAULT_GATEWAY_PORT_STEP
    grpc_ports: tuple[int, ...] = ()
    share_state: bool = True

    @property
    def replicated(self) -> bool:
        return self.count > 1


def replica_names(count: int) -> tuple[str, ...]:
    """``("scheduler", "scheduler-2", ...)``: ``count`` names, the first one unchanged."""
    return tuple(GATEWAY_SERVICE if k == 0 else f"{GATEWAY_SERVICE}-{k + 1}" for k in range(count))


def replica_ports(base: Mapping[str, int], gw: GatewayReplicas) -> list[dict[str, int]]:
    """The port settings of each replica, in name order. ``base`` is the scheduler's chosen
    ports (after any offset); replica 0 gets exactly ``base``. Every replica keeps
    ``http_port`` (the shared address); gRPC and metrics ports are spread as the module doc
    says.

    Raises ValueError (one line) for a count outside 1..MAX_GATEWAYS, a step below 1, too
    few explicit gRPC ports, or a resulting port outside 1..65535.
    """
    if not 1 <= gw.count <= MAX_GATEWAYS:
        raise ValueError(f"--gateways {gw.count}: must be 1..{MAX_GATEWAYS}")
    if gw.port_step < 1:
        raise ValueError(f"stack.gateway_port_step {gw.port_step}: must be 1 or more")
    if gw.grpc_ports and len(gw.grpc_ports) < gw.count - 1:
        raise ValueError(
            f"stack.gateway_grpc_ports lists {len(gw.grpc_ports)} ports for "
            f"{gw.count - 1} more gateway replicas"
        )
    out = [dict(base)]
    for k in range(1, gw.count):
        ports = dict(base)
        for setting, port in base.items():
            if setting == "http_port" or port == 0:
                continue
            if setting == "grpc_port" and gw.grpc_ports:
                ports[setting] = gw.grpc_ports[k - 1]
            else:
                ports[setting] = port + k * gw.port_step
            if not 1 <= ports[setting] <= 65535:
                raise ValueError(
                    f"{replica_names(gw.count)[k]} {setting} {ports[setting]} is outside "
                    "1..65535 (stack.gateway_port_step / stack.gateway_grpc_ports)"
                )
        out.append(ports)
    return out


def replica_env(name: str, gw: GatewayReplicas) -> dict[str, str]:
    """Scheduler settings a replica gets through its environment: none for a single
    gateway; else its ``replica_id``, ``share_state`` and ``http_reuse_port``."""
    if not gw.replicated:
        return {}
    return {
        "TIDESERVE_SCHEDULER__REPLICA_ID": name,
        "TIDESERVE_SCHEDULER__SHARE_STATE": "true" if gw.share_state else "false",
        "TIDESERVE_SCHEDULER__HTTP_REUSE_PORT": "true",
    }
