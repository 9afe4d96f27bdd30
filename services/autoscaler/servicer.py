"""gRPC servicer of ``tideserve.v1.AutoscalerService``: a thin translation layer.

Protobuf ⇄ :class:`services.autoscaler.deployments.Deployments`. A refused spec is
INVALID_ARGUMENT naming the field; an unknown deployment or role NOT_FOUND; a manual scale
outside bounds FAILED_PRECONDITION; a reconciler refusing a delete UNAVAILABLE.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NoReturn, TypeAlias

import grpc
from tideserve.v1 import autoscaler_pb2, autoscaler_pb2_grpc, common_pb2

from services.autoscaler.deployments import (
    Deployments,
    NotManaged,
    ScaleRefused,
    UnknownDeployment,
)
from services.autoscaler.membership import to_instance
from services.autoscaler.reconciler import RoleStatus
from services.autoscaler.translate import spec_from_proto, spec_to_proto
from services.common.planner import Decision
from services.common.planner.ports import InstanceView, ReconcileError
from services.common.planner.records import DecisionRecord
from services.common.planner.spec import DeploymentSpec, SpecError

__all__ = [
    "SERVICE_NAME",
    "AutoscalerServicer",
    "add_to_server",
    "decision_to_proto",
    "instance_to_proto",
    "record_to_proto",
]

SERVICE_NAME: str = autoscaler_pb2.DESCRIPTOR.services_by_name["AutoscalerService"].full_name
"""Full gRPC name, ``tideserve.v1.AutoscalerService`` (health and reflection use it)."""

if TYPE_CHECKING:  # the generated grpc module is untyped; keep ``Any`` out of the class
    _Base = object
else:
    _Base = autoscaler_pb2_grpc.AutoscalerServiceServicer

Ctx: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"


def instance_to_proto(
    i: InstanceView, now_ms: int, role: common_pb2.RoleSpec | None = None
) -> common_pb2.Instance:
    """The driver's status as membership events carry it (:func:`to_instance`), with the
    role kind and engine taken from the spec (``role``) when known (a hand-built view does
    not know its kind), and the last error as the ``detail`` label."""
    msg = to_instance(i.status, now_ms)
    if role is not None:
        msg.role, msg.engine_kind = role.role, role.engine_kind
    if i.detail:
        msg.labels["detail"] = i.detail
    return msg


def _instances(
    items: Sequence[InstanceView], specs: Mapping[str, DeploymentSpec], now_ms: int
) -> list[common_pb2.Instance]:
    roles = {(name, r.name): r for name, spec in specs.items() for r in spec_to_proto(spec).roles}
    return [instance_to_proto(i, now_ms, roles.get((i.deployment, i.role))) for i in items]


def record_to_proto(r: DecisionRecord) -> autoscaler_pb2.ScalingDecision:
    return autoscaler_pb2.ScalingDecision(
        decision_id=r.decision_id,
        deployment=r.deployment,
        ts_ms=r.ts_ms,
        changes=[
            autoscaler_pb2.RoleChange(
                role=c.role, from_replicas=c.from_replicas, to_replicas=c.to_replicas
            )
            for c in r.changes
        ],
        reasons=list(r.reasons),
        status=r.status,
        binding_constraint=r.binding_constraint,
        victims=list(r.victims),
        generation=r.generation,
        inputs_json=json.dumps(dict(r.inputs), sort_keys=True, default=str),
        forecast_json=json.dumps(dict(r.forecast), sort_keys=True, default=str),
    )


def decision_to_proto(d: Decision, ts_ms: int) -> autoscaler_pb2.ScalingDecision:
    """The Plan RPC's answer: every role, changed or not, status "plan"."""
    msg = record_to_proto(
        DecisionRecord(
            decision_id="",
            deployment=d.deployment,
            generation=d.generation,
            ts_ms=ts_ms,
            changes=d.changes,
            reasons=d.reasons,
            binding_constraint=d.binding,
            status="plan",
            victims=d.victims,
            inputs=d.inputs,
            forecast=d.forecast,
        )
    )
    return msg


def _role_status(s: RoleStatus) -> autoscaler_pb2.RoleStatus:
    c = s.count
    return autoscaler_pb2.RoleStatus(
        role=s.name,
        desired=s.desired,
        ready=c.ready,
        starting=c.starting,
        draining=c.draining,
        failed=c.failed,
    )


async def _abort(context: Ctx, code: grpc.StatusCode, message: str) -> NoReturn:
    await context.abort(code, message)
    raise AssertionError("unreachable")  # context.abort raises


class AutoscalerServicer(_Base):
    """``AutoscalerService``: deployments, instances and scaling decisions."""

    def __init__(self, deployments: Deployments | None, wall_ms: Callable[[], int]) -> None:
        self._deployments = deployments
        self._wall_ms = wall_ms

    async def _ready(self, context: Ctx) -> Deployments:
        if self._deployments is None:
            await _abort(
                context,
                grpc.StatusCode.FAILED_PRECONDITION,
                "the autoscaler runs without postgres_url: deployments need Postgres",
            )
        return self._deployments

    async def ApplyDeployment(
        self, request: autoscaler_pb2.ApplyDeploymentRequest, context: Ctx
    ) -> autoscaler_pb2.ApplyDeploymentResponse:
        deployments = await self._ready(context)
        try:
            spec = spec_from_proto(request.spec)
        except SpecError as exc:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        stored, changed = await deployments.apply(spec)
        return autoscaler_pb2.ApplyDeploymentResponse(spec=spec_to_proto(stored), changed=changed)

    async def GetDeployment(
        self, request: autoscaler_pb2.GetDeploymentRequest, context: Ctx
    ) -> autoscaler_pb2.GetDeploymentResponse:
        deployments = await self._ready(context)
        try:
            view = await deployments.get(request.name)
        except UnknownDeployment as exc:
            await _abort(context, grpc.StatusCode.NOT_FOUND, str(exc))
        return autoscaler_pb2.GetDeploymentResponse(
            spec=spec_to_proto(view.spec),
            instances=_instances(view.instances, {view.spec.name: view.spec}, self._wall_ms()),
            roles=[_role_status(s) for s in view.roles],
            recent_decisions=[record_to_proto(r) for r in view.decisions],
            progress=view.progress,
        )

    async def ListDeployments(
        self, request: autoscaler_pb2.ListDeploymentsRequest, context: Ctx
    ) -> autoscaler_pb2.ListDeploymentsResponse:
        deployments = await self._ready(context)
        views = await deployments.all()
        return autoscaler_pb2.ListDeploymentsResponse(
            deployments=[spec_to_proto(v.spec) for v in views]
        )

    async def DeleteDeployment(
        self, request: autoscaler_pb2.DeleteDeploymentRequest, context: Ctx
    ) -> autoscaler_pb2.DeleteDeploymentResponse:
        deployments = await self._ready(context)
        try:
            await deployments.delete(request.name)
        except ReconcileError as exc:
            await _abort(context, grpc.StatusCode.UNAVAILABLE, f"cannot drain: {exc}")
        return autoscaler_pb2.DeleteDeploymentResponse()

    async def ListInstances(
        self, request: autoscaler_pb2.ListInstancesRequest, context: Ctx
    ) -> autoscaler_pb2.ListInstancesResponse:
        deployments = await self._ready(context)
        specs = {v.spec.name: v.spec for v in await deployments.all()}
        items = deployments.instances(request.deployment)
        return autoscaler_pb2.ListInstancesResponse(
            instances=_instances(items, specs, self._wall_ms())
        )

    async def Plan(
        self, request: autoscaler_pb2.PlanRequest, context: Ctx
    ) -> autoscaler_pb2.PlanResponse:
        deployments = await self._ready(context)
        try:
            decision = await deployments.plan(request.deployment)
        except UnknownDeployment as exc:
            await _abort(context, grpc.StatusCode.NOT_FOUND, str(exc))
        except NotManaged as exc:
            await _abort(context, grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        return autoscaler_pb2.PlanResponse(decision=decision_to_proto(decision, self._wall_ms()))

    async def ScaleRole(
        self, request: autoscaler_pb2.ScaleRoleRequest, context: Ctx
    ) -> autoscaler_pb2.ScaleRoleResponse:
        deployments = await self._ready(context)
        try:
            record = await deployments.scale(
                request.deployment,
                request.role,
                request.replicas,
                pin=request.pin,
                release=request.release,
            )
        except UnknownDeployment as exc:
            await _abort(context, grpc.StatusCode.NOT_FOUND, str(exc))
        except (ScaleRefused, NotManaged) as exc:
            await _abort(context, grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        return autoscaler_pb2.ScaleRoleResponse(decision=record_to_proto(record))

    async def ListDecisions(
        self, request: autoscaler_pb2.ListDecisionsRequest, context: Ctx
    ) -> autoscaler_pb2.ListDecisionsResponse:
        deployments = await self._ready(context)
        if request.limit < 0:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, "limit must be >= 0")
        records = await deployments.decisions(request.deployment, request.limit or 20)
        return autoscaler_pb2.ListDecisionsResponse(decisions=[record_to_proto(r) for r in records])


def add_to_server(servicer: AutoscalerServicer, server: grpc.aio.Server) -> str:
    """Register ``servicer`` on ``server``; returns :data:`SERVICE_NAME`."""
    autoscaler_pb2_grpc.add_AutoscalerServiceServicer_to_server(servicer, server)
    return SERVICE_NAME
