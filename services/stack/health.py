"""grpc.health.v1 probes."""

from __future__ import annotations

import enum
import urllib.error
import urllib.request

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.common.security.channels import ClientSecurity, sync_channel


class Health(enum.StrEnum):
    """What a probe saw. Only SERVING is healthy."""

    SERVING = "SERVING"
    NOT_SERVING = "NOT_SERVING"
    SERVICE_UNKNOWN = "SERVICE_UNKNOWN"
    UNKNOWN = "UNKNOWN"
    UNREACHABLE = "UNREACHABLE"


_FROM_PROTO = {
    health_pb2.HealthCheckResponse.SERVING: Health.SERVING,
    health_pb2.HealthCheckResponse.NOT_SERVING: Health.NOT_SERVING,
    health_pb2.HealthCheckResponse.SERVICE_UNKNOWN: Health.SERVICE_UNKNOWN,
    health_pb2.HealthCheckResponse.UNKNOWN: Health.UNKNOWN,
}


def check_grpc_health(
    address: str,
    service: str = "",
    timeout_s: float = 1.0,
    security: ClientSecurity | None = None,
) -> Health:
    """One grpc.health.v1 Check of ``service`` ("" = the server overall) at ``address``.

    Never raises for network trouble: an unanswered or failed call is UNREACHABLE, a server
    that does not know ``service`` is SERVICE_UNKNOWN.
    """
    with sync_channel(address, security) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            resp = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout_s)
        except grpc.RpcError as exc:
            code = exc.code() if isinstance(exc, grpc.Call) else None
            if code == grpc.StatusCode.NOT_FOUND:
                return Health.SERVICE_UNKNOWN
            return Health.UNREACHABLE
    return _FROM_PROTO.get(resp.status, Health.UNKNOWN)


def check_http_ready(url: str, timeout_s: float = 1.0) -> Health:
    """GET ``url``: 2xx is SERVING, another HTTP status NOT_SERVING, no answer UNREACHABLE."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return Health.SERVING if 200 <= resp.status < 300 else Health.NOT_SERVING
    except urllib.error.HTTPError:
        return Health.NOT_SERVING
    except (urllib.error.URLError, OSError, ValueError):
        return Health.UNREACHABLE
