"""The OpenAI-compatible HTTP gateway (aiohttp shell over :class:`GatewayCore`).

Per request: validate (400/404/413; 404 ``model_not_found`` for a model the configured or
discovered list does not hold) → admission (fast path when nothing is queued and the fleet
has capacity; otherwise the classed queue; 429 + ``Retry-After`` when shed or timed out in
the queue; 503 at once when no engine can serve it, none registered or none healthy and
undrained, also for the requests waiting when the last one goes) → pick (429 when the SLO
filter sheds, 503 when no endpoint) → forward.
Before the first byte reaches the client, upstream connection errors, 5xx answers and
empty streams are retried on another endpoint (``retries`` times, exponential backoff
with jitter); after it, a failure ends the SSE stream with an error event and ``[DONE]``.
Forwarding a pick (the P/D flows per ``pd_protocol``, the decode call) is
:mod:`services.scheduler.http.forward`; relaying the answer (whole or SSE token by
token) is :mod:`services.scheduler.http.relay`.

Pre-emption (:mod:`services.scheduler.http.preemption`): when a higher class waits and
no capacity is left, a lower-class dispatch that has not received its first byte is
cancelled upstream and requeued with its original arrival time. A pick that fails before
its first byte (or is pre-empted) is abandoned: routing plugins undo what they recorded.

Background tasks (started/stopped with the aiohttp app): active health probes
(``GET /health``), load scraping (``GET /metrics``, SGLang or vLLM names; only endpoints
without a fresh load snapshot from the stream) and the queue pump.

``POST /v1/messages`` and ``/v1/messages/count_tokens`` (Anthropic's Messages API, its
errors in Anthropic's shape) take the same path: :mod:`services.scheduler.http.messages`.
A turn sent with ``X-Tideserve-Session-Final: 1`` ends its session: once it is answered,
routing drops the session's sticky instance (``GatewayCore.end_session``).

``GET /metrics`` serves the gateway's Prometheus registry (``gateway.metrics``; see
:mod:`services.scheduler.http.metrics`).

Tracing (the ``tracer_provider`` passed in; default: one exporting nothing): one
SERVER span per request (``/health`` and ``/metrics`` excepted), the kvmeta lookup's gRPC
client span and one CLIENT span per upstream call (``traceparent`` injected) under it, and
a session's id as ``gen_ai.conversation.id`` baggage from the parsed request on, so every
span of the turn carries it. An unrecorded request (not sampled) makes no client span: its
context is injected as is (:func:`~services.common.otel.inject`), so engines still continue
the trace. Background probes and scrapes are not traced.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from functools import partial
from typing import Any

import aiohttp
from aiohttp import web
from opentelemetry.sdk.trace import TracerProvider

from services.common import otel
from services.common.admission.shaper import DispatchShaper
from services.common.admission.shaper_config import ShaperConfig
from services.common.http_errors import json_errors
from services.common.metrics import metrics_handler
from services.common.routing.types import NoEndpoint, Pick, RequestView
from services.common.routing.types import Shed as RouteShed
from services.common.scheduling.service import GatewayCore
from services.common.tokens.engine_chat import adds_special_tokens
from services.scheduler.admission.dispatch import DispatchOrder
from services.scheduler.admission.gate import AdmissionGate, PrefixLookup
from services.scheduler.core.intake import (
    Refused,
    check_names,
    request_view,
)
from services.scheduler.core.records import RequestContext
from services.scheduler.http import messages, records, upkeep, upstream
from services.scheduler.http.errors import Overloaded, api_error, error_response, internal_errors
from services.scheduler.http.forward import Forwarder
from services.scheduler.http.limits import header_limit, parser_limits
from services.scheduler.http.metrics import GatewayMetrics
from services.scheduler.http.openai import (
    ApiError,
    Kind,
    ParsedRequest,
    intake_of,
    parse_request,
)
from services.scheduler.http.options import GatewayOptions, authorization
from services.scheduler.http.preemption import Preempted, Preemptor
from services.scheduler.http.records import Finished
from services.scheduler.http.responses import ResponsesApi, Turn
from services.scheduler.keys.gate import KeyGate
from services.scheduler.responses.store import ResponseStore


class Gateway:
    def __init__(
        self,
        core: GatewayCore,
        options: GatewayOptions | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        rng: random.Random | None = None,
        prefix_lookup: PrefixLookup | None = None,
        metrics: GatewayMetrics | None = None,
        tracer_provider: TracerProvider | None = None,
        keys: KeyGate | None = None,
        response_store: ResponseStore | None = None,
    ) -> None:
        """``metrics``: the families in the registry ``main`` passes down (default: a
        private registry of this gateway); ``tracer_provider``: the service's (default:
        :func:`~services.common.otel.quiet_provider`); ``keys``: API keys on (tenant and
        classes from the key, rate limits; :mod:`services.scheduler.keys`)."""
        self.core = core
        self.opts = options or GatewayOptions()
        self.keys = keys
        self.clock = clock
        self.wall = wall
        self.rng = rng or random.Random()
        self.models: set[str] = set(self.opts.models)
        self.tracer_provider = tracer_provider or otel.quiet_provider()
        self.metrics = metrics or GatewayMetrics()
        self.metrics.attach(core, clock)
        self.gate = AdmissionGate(
            core,
            clock,
            deployment=self.opts.deployment,
            prefix_lookup=prefix_lookup,
            tick_s=self.opts.queue_tick_s,
        )
        # Told how each request ended (metrics; request records when integrations are on).
        self.finished: list[Finished] = [
            self.metrics.finished(lambda: self.core.queue.config.default_class),
            records.annotate_span,
        ]
        # Told of every pick of a request (agent-session turns when those are on).
        self.picked: list[Callable[[RequestContext, RequestView], None]] = []
        self.preemptor = Preemptor(core, clock, enabled=self.opts.preemption)
        o = self.opts
        shaper = ShaperConfig(
            o.dispatch_hold_ms,
            o.dispatch_age_weight,
            o.dispatch_order,
            o.dispatch_follow_ms,
            protect=o.dispatch_protect != "off",
            protect_slack=o.dispatch_protect == "slack",
            protect_when_missed=(
                o.dispatch_protect_when_missed if o.dispatch_protect == "auto" else 0.0
            ),
        )
        self.dispatch = DispatchOrder(DispatchShaper(shaper), clock)
        self.gate.on_full = lambda now, cap: self.metrics.preempted(
            len(self.preemptor.consider(now, cap))
        )
        self.forwarder = Forwarder(
            core,
            pd_protocol=self.opts.pd_protocol,
            upstream_timeout_s=self.opts.upstream_timeout_s,
            connect_timeout_s=self.opts.connect_timeout_s,
            clock=clock,
            rng=self.rng,
            metrics=self.metrics,
            first_byte=self._first_byte,
            authorization=authorization(self.opts),
            native_apis=self.opts.native_apis,
        )
        # SLO class names for request validation, per queue config (not a list per request).
        self._class_names: tuple[object, frozenset[str]] = (None, frozenset())
        self._session: aiohttp.ClientSession | None = None
        self._traced: aiohttp.ClientSession | None = None
        self._tasks: list[asyncio.Task[None]] = []
        # The Responses API (services.scheduler.http.responses); the store is closed with
        # the app.
        self.responses = ResponsesApi(
            store=response_store,
            native="responses" in self.opts.native_apis,
            retention_s=self.opts.responses_retention_s,
            wall=wall,
            keys=keys is not None,
        )

    @property
    def prefix_lookup(self) -> PrefixLookup | None:
        """The precise-prefix lookup of the admission gate (shared with the servicer)."""
        return self.gate.prefix_lookup

    @prefix_lookup.setter
    def prefix_lookup(self, lookup: PrefixLookup | None) -> None:
        self.gate.prefix_lookup = lookup

    # -- app ------------------------------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application(
            client_max_size=self.opts.limits.max_body_bytes + 1,
            handler_args=parser_limits(self.opts.limits),
            middlewares=[
                messages.anthropic_errors(),  # the Messages routes answer errors in their shape
                json_errors(),  # aiohttp's own 404/405/413... in the API's error shape
                header_limit(self.opts.limits.max_header_bytes),
                otel.server_middleware(self.tracer_provider, exclude=("/health", "/metrics")),
                records.request_contexts(
                    self.finished,
                    clock=self.clock,
                    wall=self.wall,
                    rng=self.rng,
                    tool_contents=self.opts.record_tool_contents,
                ),
                *([self.keys.middleware] if self.keys else []),
                internal_errors(),
            ],
        )
        r = app.router
        r.add_post("/v1/chat/completions", self._chat)
        r.add_post("/v1/completions", self._completions)
        r.add_post("/generate", self._generate)
        r.add_post(messages.PATH, self._messages)
        r.add_post(messages.COUNT_PATH, self._count_tokens)
        self.responses.add_routes(r, self._responses)
        r.add_get("/v1/models", self._models)
        r.add_get("/health", self._health)
        r.add_get("/metrics", metrics_handler(self.metrics.registry))
        app.on_startup.append(self._start)
        app.on_cleanup.append(self._stop)
        return app

    async def _start(self, _app: web.Application) -> None:
        # No cookie jar: an engine's Set-Cookie must not ride on other clients' requests
        # (and no cookie filtering per call).
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=30),
            cookie_jar=aiohttp.DummyCookieJar(),
        )
        # Recorded requests go upstream through a traced session (a CLIENT span per call);
        # the rest through the plain one, which aiohttp's tracing signals would only slow.
        self._traced = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=30),
            cookie_jar=aiohttp.DummyCookieJar(),
            trace_configs=[otel.client_trace_config(self.tracer_provider)],
        )
        if self.opts.background:
            self._tasks = [
                asyncio.create_task(upkeep.every(self.opts.health_interval_s, self.check_health)),
                asyncio.create_task(upkeep.every(self.opts.load_interval_s, self.poll_load)),
                asyncio.create_task(upkeep.every(self.opts.queue_tick_s, self._tick)),
            ]
            if self.responses.store is not None:
                sweep = upkeep.every(self.responses.sweep_s, self.responses.sweep)
                self._tasks.append(asyncio.create_task(sweep))

    async def _stop(self, _app: web.Application) -> None:
        for t in self._tasks:
            await upstream.cancel_quietly(t)
        self._tasks.clear()
        await self.gate.close()
        if self._session is not None:
            await self._session.close()
        if self._traced is not None:
            await self._traced.close()
        await self.responses.close()

    # -- background -----------------------------------------------------------------------
    async def check_health(self) -> None:
        """Probe every endpoint's ``/health``."""
        assert self._session is not None
        await upkeep.probe_health(
            self._session, self.core.fleet, self.opts.probe_timeout_s, self.clock
        )

    async def poll_load(self) -> None:
        assert self._session is not None
        await upkeep.scrape_loads(
            self._session, self.core.fleet, self.opts.probe_timeout_s, self.clock
        )
        await self.discover_models()

    async def discover_models(self) -> None:
        """While no model name is known (none configured), learn them from the endpoints'
        ``/v1/models``. Runs with every load poll, and on a ``/v1/models`` request, so an
        endpoint that joined since the last poll (membership) is asked before answering."""
        fleet = self.core.fleet
        if self.models or self._session is None:
            return
        for i in fleet.ids():
            self.models.update(
                await upstream.list_models(
                    self._session, fleet.spec(i).url, self.opts.probe_timeout_s
                )
            )

    async def _tick(self) -> None:
        self.core.tick(self.clock())
        self.gate.pump()

    # -- handlers -------------------------------------------------------------------------
    async def _health(self, _req: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _models(self, _req: web.Request) -> web.Response:
        await self.discover_models()
        data = [{"id": m, "object": "model", "owned_by": "tideserve"} for m in sorted(self.models)]
        return web.json_response({"object": "list", "data": data})

    async def _chat(self, req: web.Request) -> web.StreamResponse:
        return await self.handle(req, "chat")

    async def _completions(self, req: web.Request) -> web.StreamResponse:
        return await self.handle(req, "completion")

    async def _generate(self, req: web.Request) -> web.StreamResponse:
        return await self.handle(req, "generate")

    async def _messages(self, req: web.Request) -> web.StreamResponse:
        return await self.handle(req, "messages")

    async def _count_tokens(self, req: web.Request) -> web.Response:
        try:
            raw = await self._body(req)
            n = messages.count_tokens(
                raw, models=self.models, limits=self.opts.limits, tokens=self.opts.tokens
            )
        except ApiError as e:
            return error_response(e)
        return web.json_response({"input_tokens": n})

    async def _body(self, req: web.Request) -> bytes:
        if (req.content_length or 0) > self.opts.limits.max_body_bytes:
            raise ApiError(413, "request body too large", None, "body_too_large")
        try:
            return await req.read()
        except web.HTTPRequestEntityTooLarge:
            raise ApiError(413, "request body too large", None, "body_too_large") from None

    async def _responses(self, req: web.Request) -> web.StreamResponse:
        return await self.handle(req, "responses")

    async def handle(self, req: web.Request, kind: Kind) -> web.StreamResponse:
        ctx = req[records.CONTEXT_KEY]
        rid = ctx.request_id
        slo_class = ""
        arrival = self.clock()
        try:
            raw = await self._body(req)
            turn: Turn | None = None
            if kind == "responses":
                special = adds_special_tokens(self.opts.tokens.scheme, kind, self.responses.native)
                parse = partial(self._parse, req, kind, raw, special_tokens=special)
                limit = self.opts.limits.max_body_bytes
                parsed, turn = await self.responses.parse(ctx, raw, parse, limit)
            else:
                parsed = self._parse(req, kind, raw)
            if self.keys is not None:
                parsed = await self.keys.admit(req, parsed)
            if turn is not None:
                parsed = turn.admitted(parsed)
            if not parsed.profile and self.opts.profile:
                parsed = replace(parsed, profile=self.opts.profile)
            slo_class = parsed.slo_class
            check_names(self.core, parsed.profile, slo_class, parsed.tenant)
            intake = intake_of(rid, parsed, self.opts.tokens, self.opts.block_size)
            view = request_view(self.core, intake, self.opts.block_size)
            ctx.taken_in(rid, parsed, self.clock())
            with otel.conversation(parsed.session_id):
                view = await self.gate.take_in(intake, view, arrival)
                ctx.admitted(self.clock())
                while True:
                    try:
                        resp = await self._route(req, ctx, parsed, view, turn)
                        if intake.session_final and resp.status < 400:
                            self.core.end_session(intake.session_id)
                        return resp
                    except Preempted:
                        # Back in line with its original arrival; its slot went to a higher
                        # class.
                        await self.gate.requeue(intake, arrival)
        except (ApiError, Refused) as err:
            e = api_error(err) if isinstance(err, Refused) else err
            if isinstance(e, Overloaded):
                cls = slo_class or self.core.queue.config.default_class
                self.metrics.shed_request(cls, e.where)
            elif e.status in (400, 404, 413):
                self.metrics.bad_request(e.code, e.param)
            return error_response(e)

    def _parse(
        self,
        req: web.Request,
        kind: Kind,
        raw: bytes,
        canonical: Mapping[str, Any] | None = None,
        special_tokens: bool = False,
    ) -> ParsedRequest:
        """``parse_request`` with this gateway's names and limits (``canonical``: a
        translated API's chat body; ``special_tokens``: as the engine tokenizes it)."""
        return parse_request(
            kind,
            raw,
            req.headers,
            models=self.models,
            classes=self._classes(),
            tenants=None if self.keys else self.opts.tenants,
            limits=self.opts.limits,
            tokens=self.opts.tokens,
            tool_contents=self.opts.record_tool_contents,
            canonical=canonical,
            special_tokens=special_tokens,
        )

    def _classes(self) -> frozenset[str]:
        config = self.core.queue.config
        known, names = self._class_names
        if known is not config:
            names = frozenset(c.name for c in config.classes)
            self._class_names = (config, names)
        return names

    async def _route(
        self,
        req: web.Request,
        ctx: RequestContext,
        p: ParsedRequest,
        view: RequestView,
        answer: Turn | None = None,
    ) -> web.StreamResponse:
        rid = ctx.request_id
        exclude: set[str] = set()
        last = ""
        for attempt in range(self.opts.retries + 1):
            now = self.clock()
            pick_id = f"{rid}.{attempt}"
            d = self.core.pick(
                replace(view, exclude=frozenset(exclude)) if exclude else view,
                now,
                pick_id,
                p.profile,
                self.opts.deployment,
            )
            ctx.picked(d, attempt)
            if isinstance(d, Pick):
                for listener in self.picked:
                    listener(ctx, view)
            if isinstance(d, RouteShed):
                raise Overloaded(d.reason, d.retry_after_ms, "routing")
            if isinstance(d, NoEndpoint):
                msg = d.reason + (f" (last upstream error: {last})" if last else "")
                raise ApiError(503, msg, None, "no_endpoint", "service_unavailable")
            try:
                if self.dispatch.enabled:
                    turn = self._turn(pick_id, p.slo_class, d, ctx.arrival, view)
                    if turn is not None:
                        await self.dispatch.wait(pick_id, turn)
                session = self._traced if otel.recording() else self._session
                assert session is not None
                return await self.preemptor.run(
                    pick_id,
                    p.slo_class,
                    self.forwarder.forward(session, req, ctx, p, d, pick_id, answer),
                )
            except Preempted:
                self.core.abandon(pick_id)
                raise
            except upstream.UpstreamFailure as f:
                self.core.abandon(pick_id)
                self.metrics.upstream_failed(f.instance_id, f.reason, attempt < self.opts.retries)
                self.core.fleet.upstream_result(f.instance_id, False, self.clock())
                exclude.add(f.instance_id)
                last = f.reason
                if attempt < self.opts.retries:
                    delay = self.opts.backoff_ms * 2**attempt * (0.5 + self.rng.random())
                    await asyncio.sleep(delay / 1000.0)
            finally:
                self.dispatch.done(pick_id)
                self.core.release(pick_id)
                self.gate.pump()
        raise ApiError(
            502, f"upstream failed after retries: {last}", None, "upstream_error", "server_error"
        )

    def _turn(
        self, pick_id: str, slo_class: str, d: Pick, arrival: float, view: RequestView
    ) -> asyncio.Future[None] | None:
        """The pick's turn on the instance that computes its prompt: None now, or a future."""
        target = (d.prefill or d.decode).endpoint.instance_id
        cls = self.core.queue.class_of(slo_class)
        budget_ms = view.ttft_slo_ms
        due = arrival + budget_ms / 1000.0 if budget_ms > 0 else None
        cached = d.predicted_cached_tokens // max(1, view.block_size)
        return self.dispatch.offer(
            pick_id, target, d.predicted_prefill_ms, -cls.priority, due, view.block_hashes,
            cached, cls.starve_after_ms,
        )  # fmt: skip

    def _first_byte(self, pick_id: str) -> None:
        self.preemptor.started(pick_id)
        self.dispatch.first_byte(pick_id)
        self.core.first_token(pick_id)
