"""gRPC servicer of ``tideserve.v1.SchedulerService``: a thin translation layer over
:class:`services.common.scheduling.service.GatewayCore` (the same core the HTTP gateway uses).

Pick takes the request in exactly as the HTTP gateway does (:mod:`services.scheduler.core.intake`
and the shared :class:`~services.scheduler.admission.gate.AdmissionGate`): the prefix lookup,
then admission: at once when nothing is queued and a slot is free, else a wait in the classed
queue (the call returns when the request is released). Pick reserves load on the chosen
endpoints until ReportOutcome releases it (or the core's reservation TTL does).
Errors: INVALID_ARGUMENT (bad fields), NOT_FOUND (unknown deployment, profile, class, tenant
when tenants are configured, pick or instance), RESOURCE_EXHAUSTED where HTTP answers 429
(queue full, deadline unreachable, timed out in the queue, or TTFT SLO infeasible;
``retry_after_ms`` in the message and trailing metadata ``retry-after-ms``), UNAVAILABLE
(no engine can serve the request: none registered, or none healthy, undrained and
closed-circuit; answered at once, and also to requests waiting in the queue when the last
such engine goes).

PickStream decides each request of a bidirectional stream exactly as Pick would: untagged
requests one after another, answered in request order; tagged ones (``PickRequest.tag``)
beside them, each answered as soon as it is decided. A refused request gets a
``PickResponse`` whose ``error`` carries Pick's status code, message and retry hint, and
the stream goes on.
Drain/Undrain act on this replica's fleet, in memory: they do not survive a restart and do
not reach other replicas (a drain every replica follows is the autoscaler's ``DRAINING``
membership event on ``{prefix}:membership``).

``PickRequest.report_outcomes`` settles earlier picks (as ReportOutcome) before deciding;
unknown or already reported pick ids there are ignored.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

import grpc
from tideserve.v1 import common_pb2, events_pb2, scheduler_pb2, scheduler_pb2_grpc

from services.common.routing.types import (
    Choice,
    EndpointView,
    NoEndpoint,
    Role,
    Shed,
)
from services.common.scheduling.service import GatewayCore
from services.common.tokens import TokenPath
from services.common.tokens.hashing import DEFAULT_BLOCK_SIZE
from services.scheduler.admission.gate import AdmissionGate, PrefixLookup
from services.scheduler.core.intake import (
    Intake,
    Refused,
    check_names,
    request_view,
)
from services.scheduler.core.pick_records import PickMemo, record_from_report
from services.scheduler.core.records import parse_traceparent
from services.scheduler.http.upstream import bootstrap_fields

__all__ = ["SERVICE_NAME", "SchedulerServicer", "add_to_server"]

SERVICE_NAME: str = scheduler_pb2.DESCRIPTOR.services_by_name["SchedulerService"].full_name
"""Full gRPC name, ``tideserve.v1.SchedulerService`` (health and reflection use it)."""

if TYPE_CHECKING:  # the generated grpc module is untyped; keep ``Any`` out of the class
    _Base = object
else:
    _Base = scheduler_pb2_grpc.SchedulerServiceServicer

_ROLE_PB: dict[Role, int] = {
    "worker": common_pb2.ROLE_WORKER,
    "prefill": common_pb2.ROLE_PREFILL,
    "decode": common_pb2.ROLE_DECODE,
}
_MAX_HASHES = 1_000_000


def _instance(e: EndpointView, deployment: str) -> common_pb2.Instance:
    return common_pb2.Instance(
        instance_id=e.instance_id,
        deployment=deployment,
        role=_ROLE_PB[e.role],  # type: ignore[arg-type]
        engine_kind=common_pb2.ENGINE_KIND_SIM,
        endpoint=common_pb2.Endpoint(
            url=e.url, bootstrap_host=e.bootstrap_host, bootstrap_port=e.bootstrap_port
        ),
        state=common_pb2.INSTANCE_STATE_DRAINING if e.draining else common_pb2.INSTANCE_STATE_READY,
        labels=dict(e.labels),
    )


class _Instances:
    """``Instance`` messages per endpoint view, built once per view object (the fleet
    keeps a view until the endpoint changes). Bounded: cleared when it fills."""

    def __init__(self, deployment: str, max_size: int = 4096) -> None:
        self.deployment = deployment
        self.max_size = max_size
        self._cache: dict[int, tuple[EndpointView, common_pb2.Instance]] = {}

    def get(self, e: EndpointView) -> common_pb2.Instance:
        hit = self._cache.get(id(e))
        if hit is not None and hit[0] is e:
            return hit[1]
        if len(self._cache) >= self.max_size:
            self._cache.clear()
        msg = _instance(e, self.deployment)
        self._cache[id(e)] = (e, msg)
        return msg


class _Refused(Exception):
    """Pick refuses a request: unary Pick fails with ``code``, PickStream answers with it."""

    def __init__(self, code: grpc.StatusCode, message: str, retry_after_ms: int = 0) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.retry_after_ms = retry_after_ms


def _exhausted(why: str, retry_ms: int) -> _Refused:
    return _Refused(
        grpc.StatusCode.RESOURCE_EXHAUSTED, f"{why}; retry_after_ms={retry_ms}", retry_ms
    )


def _refused(e: Refused) -> _Refused:
    if e.kind == "overloaded":
        return _exhausted(e.message, e.retry_after_ms)
    if e.kind == "unavailable":
        return _Refused(grpc.StatusCode.UNAVAILABLE, e.message)
    return _Refused(grpc.StatusCode.NOT_FOUND, e.message)


def _picked(c: Choice, instances: _Instances, out: scheduler_pb2.PickedEndpoint) -> None:
    out.instance.CopyFrom(instances.get(c.endpoint))
    out.score = c.score
    add = out.scores.add
    for n, s, w in c.scores:
        add(plugin=n, score=s, weight=w)


class SchedulerServicer(_Base):
    """``SchedulerService`` over a :class:`GatewayCore`."""

    def __init__(
        self,
        core: GatewayCore,
        *,
        deployment: str = "default",
        block_size: int = DEFAULT_BLOCK_SIZE,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        remember_picks: int = 100_000,
        prefix_lookup: PrefixLookup | None = None,
        records: Callable[[events_pb2.RequestRecord], object] | None = None,
        replica_id: str = "",
        wall: Callable[[], float] = time.time,
        gate: AdmissionGate | None = None,
        tokens: TokenPath | None = None,
    ) -> None:
        """``records``: where the record of each settled pick goes (e.g. a RecordSink's
        ``offer``; it must not block); None = no records. ``gate``: the admission gate
        shared with the HTTP gateway of the same core (None = one of its own, with
        ``prefix_lookup``). ``tokens``: how ``prompt_text`` becomes token ids and token ids
        block hashes (the gateway's; None = the simulator's)."""
        self.core = core
        self.records = records
        self.replica_id = replica_id
        self.wall = wall
        self.gate = gate or AdmissionGate(
            core, clock, deployment=deployment, prefix_lookup=prefix_lookup
        )
        self.deployment = deployment
        self.block_size = block_size
        self.tokens = tokens or TokenPath()
        self.clock = clock
        self.rng = rng or random.Random()
        # id → (decode instance, settled, what its record needs (None: records off))
        self._picks: OrderedDict[str, tuple[str, bool, PickMemo | None]] = OrderedDict()
        self._remember = remember_picks
        self._instances = _Instances(deployment)

    async def Pick(
        self, request: scheduler_pb2.PickRequest, context: grpc.aio.ServicerContext
    ) -> scheduler_pb2.PickResponse:
        try:
            return await self._decide(request)
        except _Refused as e:
            if e.code == grpc.StatusCode.RESOURCE_EXHAUSTED:
                context.set_trailing_metadata((("retry-after-ms", str(e.retry_after_ms)),))
            await context.abort(e.code, e.message)
            raise AssertionError("unreachable") from None

    async def PickStream(
        self,
        request_iterator: AsyncIterator[scheduler_pb2.PickRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[scheduler_pb2.PickResponse]:
        """One response per request. Untagged requests are decided one after another and
        answered in order; a tagged one is decided beside them and answered as soon as it is
        decided. A refused request gets a response carrying ``error`` (Pick's code and
        message) and the stream goes on."""
        answers: asyncio.Queue[scheduler_pb2.PickResponse | BaseException | None]
        answers = asyncio.Queue()
        tasks: set[asyncio.Task[None]] = set()

        async def answer(r: scheduler_pb2.PickRequest, after: asyncio.Task[None] | None) -> None:
            if after is not None:
                await asyncio.wait([after])
            try:
                answers.put_nowait(await self._answer(r))
            except Exception as e:  # not a refusal: the stream ends with it
                answers.put_nowait(e)

        async def read() -> None:
            last: asyncio.Task[None] | None = None
            try:
                async for r in request_iterator:
                    t = asyncio.create_task(answer(r, None if r.tag else last))
                    if not r.tag:
                        last = t
                    tasks.add(t)
                    t.add_done_callback(tasks.discard)
                while tasks:
                    await asyncio.wait(tasks)
            except Exception as e:  # the transport failed: end the stream
                answers.put_nowait(e)
            answers.put_nowait(None)

        reader = asyncio.create_task(read())
        try:
            while (item := await answers.get()) is not None:
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            for t in (reader, *tasks):
                t.cancel()

    async def _answer(self, r: scheduler_pb2.PickRequest) -> scheduler_pb2.PickResponse:
        """PickStream's answer to one request: the decision, or Pick's refusal as ``error``."""
        try:
            resp = await self._decide(r)
        except _Refused as e:
            resp = scheduler_pb2.PickResponse(
                error=scheduler_pb2.PickError(
                    code=e.code.value[0], message=e.message, retry_after_ms=e.retry_after_ms
                )
            )
        resp.tag = r.tag
        return resp

    async def _decide(self, r: scheduler_pb2.PickRequest) -> scheduler_pb2.PickResponse:
        """Pick's decision; raises :class:`_Refused` with Pick's status code."""
        for o in r.report_outcomes:
            if o.pick_id in self._picks:
                self._settle(o)
        arrival = self.clock()
        intake = self._intake(r)
        view = request_view(self.core, intake, self.block_size)
        try:
            view = await self.gate.take_in(intake, view, arrival)
        except Refused as e:
            raise _refused(e) from None
        admitted = self.clock()
        pick_id = intake.request_id
        d = self.core.pick(view, admitted, pick_id, r.profile)
        if isinstance(d, Shed):
            raise _exhausted(d.reason, d.retry_after_ms)
        if isinstance(d, NoEndpoint):
            raise _Refused(grpc.StatusCode.UNAVAILABLE, d.reason)
        memo = None
        if self.records is not None:
            tp = parse_traceparent(r.traceparent) if r.traceparent else None
            memo = PickMemo(
                d,
                r.tenant,
                r.slo_class,
                r.session_id,
                intake.prompt_tokens,
                self.wall(),
                tp[0] if tp else "",
                queue_ms=(admitted - arrival) * 1000.0,
            )
        self._remember_pick(pick_id, d.decode.endpoint.instance_id, memo)
        resp = scheduler_pb2.PickResponse(
            pick_id=pick_id,
            disaggregated=d.disaggregated,
            predicted_cached_tokens=d.predicted_cached_tokens,
            predicted_ttft_ms=d.predicted_ttft_ms,
            profile=d.profile,
        )
        _picked(d.decode, self._instances, resp.decode)
        if d.prefill is not None:
            _picked(d.prefill, self._instances, resp.prefill)
            b = bootstrap_fields(d.prefill.endpoint, self.rng.getrandbits(62))
            resp.bootstrap_host = b["bootstrap_host"]
            resp.bootstrap_port = b["bootstrap_port"]
            resp.bootstrap_room = b["bootstrap_room"]
        return resp

    def _intake(self, r: scheduler_pb2.PickRequest) -> Intake:
        """The request as the core's intake; raises :class:`_Refused` for bad fields."""
        if not r.deployment:
            raise _Refused(grpc.StatusCode.INVALID_ARGUMENT, "deployment is required")
        if r.deployment != self.deployment:
            raise _Refused(grpc.StatusCode.NOT_FOUND, f"unknown deployment {r.deployment!r}")
        try:
            check_names(self.core, r.profile, r.slo_class, r.tenant)
        except Refused as e:
            raise _refused(e) from None
        if r.prompt_tokens < 0 or r.max_tokens < 0:
            raise _Refused(
                grpc.StatusCode.INVALID_ARGUMENT, "prompt_tokens and max_tokens must be >= 0"
            )
        if len(r.block_hashes) > _MAX_HASHES:
            raise _Refused(grpc.StatusCode.INVALID_ARGUMENT, "too many block_hashes")
        if r.block_hashes:
            hashes = tuple(r.block_hashes)
            n_tokens = r.prompt_tokens or len(hashes) * self.block_size
        else:
            ids = list(r.prompt_token_ids) or self.tokens.encode(r.prompt_text)
            hashes = tuple(self.tokens.block_hashes(ids, self.block_size, tenant=""))
            n_tokens = r.prompt_tokens or len(ids)
        deadline_in = r.deadline_ms - self.wall() * 1000.0 if r.deadline_ms else None
        if deadline_in is not None and deadline_in <= 0:
            raise _Refused(grpc.StatusCode.INVALID_ARGUMENT, "deadline_ms is in the past")
        return Intake(
            request_id=uuid.uuid4().hex,
            prompt_tokens=n_tokens,
            block_hashes=hashes,
            max_tokens=r.max_tokens,
            tenant=r.tenant,
            slo_class=r.slo_class,
            session_id=r.session_id,
            parent_session_id=r.parent_session_id,
            profile=r.profile,
            deadline_in_ms=deadline_in,
            exclude=frozenset(r.exclude_instances),
        )

    def _remember_pick(self, pick_id: str, decode: str, memo: PickMemo | None) -> None:
        self._picks[pick_id] = (decode, False, memo)
        while len(self._picks) > self._remember:
            self._picks.popitem(last=False)

    def _settle(self, request: scheduler_pb2.ReportOutcomeRequest) -> None:
        """Apply a known pick's outcome once (idempotent per pick id); the first outcome
        also emits the pick's request record."""
        decode, done, memo = self._picks[request.pick_id]
        if done:
            return
        o = request.outcome
        if o == events_pb2.REQUEST_OUTCOME_UPSTREAM_ERROR and not request.completion_tokens:
            # Failed before any token: routing plugins undo what they recorded.
            self.core.abandon(request.pick_id)
        self.core.release(request.pick_id)
        self.gate.pump()  # a slot is free: the next queued request may go
        self._picks[request.pick_id] = (decode, True, None)
        if memo is not None and self.records is not None:
            self.records(
                record_from_report(
                    request.pick_id,
                    memo,
                    request,
                    deployment=self.deployment,
                    replica_id=self.replica_id,
                    finish_wall=self.wall(),
                )
            )
        if o == events_pb2.REQUEST_OUTCOME_UPSTREAM_ERROR:
            self.core.fleet.upstream_result(decode, False, self.clock())
        elif o == events_pb2.REQUEST_OUTCOME_OK:
            self.core.fleet.upstream_result(decode, True, self.clock())

    async def ReportOutcome(
        self, request: scheduler_pb2.ReportOutcomeRequest, context: grpc.aio.ServicerContext
    ) -> scheduler_pb2.ReportOutcomeResponse:
        if request.pick_id not in self._picks:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown pick_id {request.pick_id!r}")
            raise AssertionError("unreachable")
        self._settle(request)
        return scheduler_pb2.ReportOutcomeResponse()

    async def ListEndpoints(
        self, request: scheduler_pb2.ListEndpointsRequest, context: grpc.aio.ServicerContext
    ) -> scheduler_pb2.ListEndpointsResponse:
        if request.deployment and request.deployment != self.deployment:
            return scheduler_pb2.ListEndpointsResponse()
        now = self.clock()
        out = []
        for e in self.core.fleet.snapshot(now):
            load = events_pb2.LoadSnapshot(
                deployment=self.deployment,
                instance_id=e.instance_id,
                role=_ROLE_PB[e.role],  # type: ignore[arg-type]
                num_running=e.running,
                num_waiting=e.waiting,
                kv_usage=e.kv_usage,
                tokens_in_flight=e.tokens_in_flight,
                pending_prefill_tokens=e.pending_prefill_tokens,
                prefill_tokens_per_s=e.prefill_tokens_per_s,
            )
            out.append(
                scheduler_pb2.EndpointStatus(
                    instance=_instance(e, self.deployment),
                    load=load,
                    healthy=e.healthy,
                    draining=e.draining,
                    circuit=e.circuit,
                    in_flight=self.core.fleet.in_flight(e.instance_id),
                )
            )
        return scheduler_pb2.ListEndpointsResponse(endpoints=out)

    async def Drain(
        self, request: scheduler_pb2.DrainRequest, context: grpc.aio.ServicerContext
    ) -> scheduler_pb2.DrainResponse:
        if request.instance_id not in self.core.fleet:
            await context.abort(
                grpc.StatusCode.NOT_FOUND, f"unknown instance {request.instance_id!r}"
            )
        return scheduler_pb2.DrainResponse(
            in_flight=self.core.fleet.set_draining(request.instance_id, True)
        )

    async def Undrain(
        self, request: scheduler_pb2.UndrainRequest, context: grpc.aio.ServicerContext
    ) -> scheduler_pb2.UndrainResponse:
        if request.instance_id not in self.core.fleet:
            await context.abort(
                grpc.StatusCode.NOT_FOUND, f"unknown instance {request.instance_id!r}"
            )
        self.core.fleet.set_draining(request.instance_id, False)
        return scheduler_pb2.UndrainResponse()


def add_to_server(servicer: SchedulerServicer, server: grpc.aio.Server) -> str:
    """Register ``servicer`` on ``server``; returns :data:`SERVICE_NAME`."""
    scheduler_pb2_grpc.add_SchedulerServiceServicer_to_server(servicer, server)
    return SERVICE_NAME
