"""The stack's engines through its autoscaler and gateway (blocking gRPC clients for ``up``).

``up`` applies the stack's deployment (:func:`apply_deployment`), then waits until the
autoscaler lists every engine READY (:func:`list_instances`) and every gateway replica routes
to them (:func:`gateway_ready`): :func:`start_engines`. :func:`engines_progress` is the pure
verdict on one look.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import grpc
from tideserve.v1 import (
    autoscaler_pb2,
    autoscaler_pb2_grpc,
    common_pb2,
    scheduler_pb2,
    scheduler_pb2_grpc,
)

from services.common.security.channels import ClientSecurity, sync_channel

__all__ = [
    "EngineOps",
    "EngineView",
    "EnginesFailed",
    "Progress",
    "apply_deployment",
    "engines_progress",
    "gateway_ready",
    "list_instances",
    "start_engines",
]

_STATE_NAME = {
    common_pb2.INSTANCE_STATE_STARTING: "starting",
    common_pb2.INSTANCE_STATE_READY: "ready",
    common_pb2.INSTANCE_STATE_DRAINING: "draining",
    common_pb2.INSTANCE_STATE_FAILED: "failed",
    common_pb2.INSTANCE_STATE_STOPPED: "stopped",
}


@dataclass(frozen=True)
class EngineView:
    """One instance as ``ListInstances`` shows it."""

    instance_id: str
    state: str
    url: str


@dataclass(frozen=True)
class Progress:
    """``ready``: every wanted engine READY (and, when the gateways were asked, routed to);
    ``failed``: ids that died while starting; ``summary``: one line for the user."""

    ready: bool
    failed: tuple[str, ...]
    summary: str


def engines_progress(
    views: Sequence[EngineView], want: int, routed: Sequence[set[str]] | None = None
) -> Progress:
    """How far the stack's ``want`` engines are (pure). ``routed``: per gateway replica, the
    ids it routes to (None: not asked yet)."""
    ready = {v.instance_id for v in views if v.state == "ready"}
    failed = tuple(sorted(v.instance_id for v in views if v.state == "failed"))
    counts: dict[str, int] = {}
    for v in views:
        counts[v.state] = counts.get(v.state, 0) + 1
    summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "none yet"
    done = len(ready) >= want
    if done and routed is not None:
        missing = [sorted(ready - r) for r in routed if not ready <= r]
        if missing:
            done = False
            summary += f"; a gateway does not route to {', '.join(missing[0])} yet"
    return Progress(done, failed, f"engines: {summary} of {want}")


def apply_deployment(
    address: str,
    spec: Mapping[str, Any],
    timeout_s: float,
    security: ClientSecurity | None = None,
) -> None:
    """``ApplyDeployment`` of ``spec`` (YAML data), then ``ScaleRole`` of each role to its
    ``replicas``: a stored deployment keeps the desired count of an earlier run (the planner
    owns counts), but the stack's flags say how many engines run now. SpecError/ValueError
    when the spec is refused locally, grpc.RpcError when the autoscaler refuses it."""
    from services.autoscaler.translate import spec_to_proto
    from services.common.planner.spec import parse_spec

    msg = spec_to_proto(parse_spec(dict(spec)))
    with sync_channel(address, security) as channel:
        stub = autoscaler_pb2_grpc.AutoscalerServiceStub(channel)
        stub.ApplyDeployment(autoscaler_pb2.ApplyDeploymentRequest(spec=msg), timeout=timeout_s)
        for role in msg.roles:  # the flags win over a count stored by an earlier run
            stub.ScaleRole(
                autoscaler_pb2.ScaleRoleRequest(
                    deployment=msg.name, role=role.name, replicas=role.replicas
                ),
                timeout=timeout_s,
            )


def list_instances(
    address: str, deployment: str, timeout_s: float, security: ClientSecurity | None = None
) -> list[EngineView]:
    """The deployment's instances as the autoscaler lists them."""
    with sync_channel(address, security) as channel:
        stub = autoscaler_pb2_grpc.AutoscalerServiceStub(channel)
        resp = stub.ListInstances(
            autoscaler_pb2.ListInstancesRequest(deployment=deployment), timeout=timeout_s
        )
    return [
        EngineView(i.instance_id, _STATE_NAME.get(i.state, "unknown"), i.endpoint.url)
        for i in resp.instances
    ]


def gateway_ready(
    address: str, deployment: str, timeout_s: float, security: ClientSecurity | None = None
) -> set[str]:
    """The instance ids one gateway replica routes to (healthy, not draining)."""
    with sync_channel(address, security) as channel:
        stub = scheduler_pb2_grpc.SchedulerServiceStub(channel)
        resp = stub.ListEndpoints(
            scheduler_pb2.ListEndpointsRequest(deployment=deployment), timeout=timeout_s
        )
    return {e.instance.instance_id for e in resp.endpoints if e.healthy and not e.draining}


class EnginesFailed(Exception):
    """The stack's engines did not come up; the message is one line for the user."""


@dataclass(frozen=True)
class EngineOps:
    """The calls ``up`` makes for its engines (injectable for tests)."""

    apply: Callable[[str, Mapping[str, Any], float], None] = apply_deployment
    instances: Callable[[str, str, float], list[EngineView]] = list_instances
    routed: Callable[[str, str, float], set[str]] = gateway_ready

    @classmethod
    def secured(cls, security: ClientSecurity) -> EngineOps:
        """The real calls, made with ``security`` (the stack's admin token)."""
        return cls(
            partial(apply_deployment, security=security),
            partial(list_instances, security=security),
            partial(gateway_ready, security=security),
        )


def start_engines(
    ops: EngineOps,
    *,
    autoscaler: str,
    gateways: Sequence[str],
    spec: Mapping[str, Any],
    timeout_s: float,
    rpc_timeout_s: float,
    pause: Callable[[float], None],
    clock: Callable[[], float],
) -> list[EngineView]:
    """Apply ``spec`` to the autoscaler, then wait (``pause`` between looks; it may raise to
    stop) until its engines are READY and every gateway routes to them. EnginesFailed when
    the spec is refused, an engine dies while starting, or ``timeout_s`` passes."""
    want = sum(int(r["replicas"]) for r in spec["roles"])
    name = str(spec["name"])
    try:
        ops.apply(autoscaler, spec, rpc_timeout_s)
    except grpc.RpcError as exc:
        raise EnginesFailed(f"the autoscaler refused the stack's deployment: {_rpc(exc)}") from exc
    except ValueError as exc:
        raise EnginesFailed(f"the stack's deployment is invalid: {exc}") from exc
    deadline = clock() + timeout_s
    last = Progress(False, (), "engines: no answer yet")
    while True:
        try:
            views = ops.instances(autoscaler, name, rpc_timeout_s)
            last = engines_progress(views, want)
            if last.ready:
                routed = [ops.routed(g, name, rpc_timeout_s) for g in gateways]
                last = engines_progress(views, want, routed)
        except grpc.RpcError as exc:
            last = Progress(False, (), f"engines: {_rpc(exc)}")
        if last.failed:
            raise EnginesFailed(f"engine {', '.join(last.failed)} failed to start ({last.summary})")
        if last.ready:
            return views
        if clock() > deadline:
            raise EnginesFailed(f"not ready within {timeout_s:g}s: {last.summary}")
        pause(0.2)


def _rpc(exc: grpc.RpcError) -> str:
    code = exc.code() if isinstance(exc, grpc.Call) else None
    details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
    return f"{code.name if code else 'error'}: {details}"
