"""aiohttp shell of the engine simulator: drives :class:`EngineCore` in real time and serves
the HTTP API of an SGLang/vLLM instance (see :mod:`services.engine.api` for the request forms
and :mod:`services.engine.metrics` for ``/metrics``).

Time: modelled time ``now_ms() = (monotonic() - start) * 1000 * speedup``. One asyncio task
steps the core; a step of modelled duration ``d`` planned at ``t`` delivers its tokens at
``t + d``, and the next step starts there (:mod:`services.engine.pacing`: the shell's own
overhead is not added to the model, within ``catch_up_ms``). Latencies in responses and
metrics are modelled milliseconds; a loaded CPU still delays tokens past their modelled time
(by ``speedup`` times as much in modelled time): keep ``speedup`` moderate (≤ 20).

Elsewhere: SGLang disaggregation (``bootstrap_*`` fields, ``GET /bootstrap/{room}``):
:mod:`services.engine.pd_sglang`; vLLM's (``kv_transfer_params``, ``POST
/kv_transfer/notify``): :mod:`services.engine.pd_vllm`; real KV bytes (``--kv-data-plane``,
Mooncake's Transfer Engine): :mod:`services.engine.kvbytes`, :mod:`services.engine.pd_bytes`;
KV events and resyncs (with Redis): :mod:`services.engine.events`; info and admin endpoints
(``/health``, ``/metrics``, ``POST /fault``, ...): :mod:`services.engine.info_routes`;
``/tideserve/retention`` (protect and offload idle sessions' blocks):
:mod:`services.engine.retention_route`.

A request whose client went away is aborted (KV freed, no further work) within one
``kv_flush_ms`` even before anything was written to it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import time
import uuid
from typing import Any

import aiohttp
from aiohttp import web
from opentelemetry.sdk.trace import TracerProvider

from services.common import otel
from services.common.engine_core.core import (
    AdmissionError,
    CoreConfig,
    EngineCore,
    EngineRole,
    Request,
    SeqOutput,
)
from services.common.engine_core.kvcache import KVCache
from services.common.engine_core.steptrace import StepTrace
from services.common.perfmodel import get_profile
from services.common.tasks import pause, stop_tasks
from services.common.tokens import TokenPath, token_path
from services.engine import api, kv_source, pd_sglang, pd_vllm, respond
from services.engine.agent_apis import AgentRoutes
from services.engine.events import EventPublisher, LoadFigures, ResyncListener, load_snapshot
from services.engine.info_routes import Faults, InfoRoutes, bad_request, write_model_dir
from services.engine.kvbytes import kv_bytes_for
from services.engine.metrics import EngineMetrics
from services.engine.pacing import RateWindow, core_figures, step_start
from services.engine.pd_bytes import PDBytes
from services.engine.prefetch import Prefetcher
from services.engine.respond import Live
from services.engine.retention_route import RetentionRoute
from services.engine.settings import EngineSettings
from services.engine.tier_io import TierIO, tier_io_for

__all__ = ["TRACED_PATHS", "EngineServer", "write_model_dir"]

log = logging.getLogger(__name__)

TRACED_PATHS = frozenset(
    {
        "/generate",
        "/v1/completions",
        "/v1/chat/completions",
        "/v1/messages",
        "/v1/responses",
        pd_vllm.NOTIFY_PATH,
    }
)
"""The API requests a traced engine makes spans of (not probes, scrapes, info, admin)."""


class EngineServer:
    """One simulated engine. ``app()`` builds the aiohttp application; its startup/cleanup
    hooks start and stop the stepping loop and the event publisher."""

    def __init__(
        self,
        settings: EngineSettings,
        *,
        redis: Any | None = None,
        tokens: TokenPath | None = None,
        tracer_provider: TracerProvider | None = None,
    ) -> None:
        """``tokens``: how prompts become token ids (default: from ``settings.model_path``);
        ``tracer_provider``: trace the API requests (and the P/D calls this engine makes)
        with it (None = no tracing)."""
        self.settings = settings
        self.tracer_provider = tracer_provider
        self.tokens = tokens or token_path(settings.model_path)
        self.profile = get_profile(settings.profile)
        blocks = settings.kv_blocks or max(
            1, self.profile.kv_capacity_tokens // settings.block_size
        )
        self.role = EngineRole(settings.role)
        cfg = CoreConfig(
            role=self.role,
            max_batch=settings.max_batch,
            max_batched_tokens=settings.max_batched_tokens,
            hold_timeout_ms=settings.hold_timeout_s * 1000.0 * settings.speedup,
            decode_keeps_kv=settings.decode_keeps_kv,
            short_first_tokens=settings.short_first_tokens,
        )
        offload = settings.kvcache_tier and settings.kvcache_policy == "offload_on_evict"
        cache = KVCache(
            blocks,
            settings.block_size,
            hold_evicted=offload,
            running_blocks=settings.kv_running_blocks or None,
        )
        self.core = EngineCore(cfg, self.profile, cache)
        self.metrics = EngineMetrics(
            settings.metrics_dialect, settings.model, blocks, settings.block_size
        )
        self.faults = Faults(settings.fail_rate, settings.die_after_tokens, settings.refuse_health)
        self.epoch = int(time.time() * 1000)
        self.instance_id = settings.instance_id or f"{settings.host}:{settings.port}"
        self.url = f"http://{settings.host}:{settings.port}"
        self.model_dir = settings.model_path or write_model_dir(
            settings.state_dir, settings.model, self.profile.max_context
        )
        self._redis = redis
        self._t0 = time.monotonic()
        self._rng = random.Random(settings.seed)
        self._live: dict[str, Live] = {}
        self._kick = asyncio.Event()
        self._notify = pd_vllm.notify_handler(self.core, self.now_ms, self._kick)
        # Sequences the step in progress finishes: the core let go of them when it planned
        # the step, but until its outputs are delivered they run (as in SGLang's batch).
        self._finishing = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False
        self._listener: ResyncListener | None = None
        self._gen_window = RateWindow()
        self._trace: StepTrace | None = None
        self._newest_arrival_ms = 0.0
        self._prefill_window = RateWindow()
        self._publisher: EventPublisher | None = None
        self._http: aiohttp.ClientSession | None = None
        self._bootstrap_runner: web.AppRunner | None = None
        self.remote_kv = pd_vllm.RemoteKV(self.instance_id, self.profile.tp, settings.block_size)
        self.kvbytes = kv_bytes_for(settings, blocks, self.profile.kv_bytes_per_token)
        self.pd_bytes = (
            PDBytes(
                self.kvbytes,
                self.core.cache,
                self.now_ms,
                timeout_s=settings.kv_transfer_timeout_s,
                on_pull=self.metrics.on_kv_pull,
            )
            if self.kvbytes is not None
            else None
        )
        self.tier_io: TierIO | None = None  # with --kvcache-tier, built at startup
        self.prefetcher = Prefetcher()  # its tier_io is set when that is built
        self.rendezvous = pd_sglang.Rendezvous(
            self.core,
            self.profile,
            self.now_ms,
            self._kick.set,
            bootstrap_timeout_s=settings.bootstrap_timeout_s,
            hold_timeout_s=settings.hold_timeout_s,
            kv=self.pd_bytes,
            release=lambda h, p, r, st: self.remote_kv.release(self._http, h, p, r, st),
        )
        self._conns: dict[str, tuple[web.Request, asyncio.Task[Any]]] = {}

    # -- time ----------------------------------------------------------------------------
    def now_ms(self) -> float:
        return (time.monotonic() - self._t0) * 1000.0 * self.settings.speedup

    def _real_s(self, model_ms: float) -> float:
        return max(0.0, model_ms) / 1000.0 / self.settings.speedup

    # -- application ---------------------------------------------------------------------
    def app(self) -> web.Application:
        middlewares = []
        if self.tracer_provider is not None:
            middlewares.append(otel.server_middleware(self.tracer_provider, only=TRACED_PATHS))
        app = web.Application(client_max_size=64 * 1024 * 1024, middlewares=middlewares)
        r = app.router
        info = InfoRoutes(self)
        info.add_to(r)
        r.add_post("/generate", self._generate)
        r.add_post("/v1/completions", self._completions)
        r.add_post("/v1/chat/completions", self._chat)
        AgentRoutes(self._handle, self.tokens).add_to(r)
        r.add_get("/bootstrap/{room}", self.rendezvous.handler)
        r.add_post(pd_vllm.NOTIFY_PATH, self._notify)
        info.add_admin_to(r)
        RetentionRoute(self).add_to(r)
        app.on_startup.append(self._on_startup)
        app.on_cleanup.append(self._on_cleanup)
        return app

    async def _on_startup(self, _app: web.Application) -> None:
        self._t0 = time.monotonic()
        if self.settings.step_trace is not None:
            self._trace = StepTrace(self.settings.step_trace)
        if self.kvbytes is not None:
            await self.kvbytes.start()  # DataPlaneError: the engine does not start
            if self.settings.kvcache_tier:
                self.tier_io = tier_io_for(
                    self.settings, self.kvbytes, self.core, self.now_ms, self._kick.set
                )
                self.prefetcher.tier_io = self.tier_io
        p = self.tracer_provider
        self._http = aiohttp.ClientSession(
            trace_configs=[otel.client_trace_config(p)] if p is not None else None
        )
        if self._redis is not None:
            from services.common.streams import StreamProducer

            self._publisher = EventPublisher(
                StreamProducer(self._redis),
                prefix=self.settings.stream_prefix,
                deployment=self.settings.deployment,
                instance_id=self.instance_id,
                epoch=self.epoch,
                block_size=self.settings.block_size,
            )
        if self.role is EngineRole.PREFILL and self.settings.bootstrap_port:
            bapp = web.Application()
            bapp.router.add_get("/bootstrap/{room}", self.rendezvous.handler)
            bapp.router.add_post(pd_vllm.NOTIFY_PATH, self._notify)
            self._bootstrap_runner = web.AppRunner(bapp)
            await self._bootstrap_runner.setup()
            site = web.TCPSite(
                self._bootstrap_runner, self.settings.host, self.settings.bootstrap_port
            )
            await site.start()
        self._tasks.append(asyncio.create_task(self._step_loop(), name="engine-step"))
        self._tasks.append(asyncio.create_task(self._event_loop(), name="engine-events"))
        if self._redis is not None:
            assert self._publisher is not None
            self._listener = self._publisher.resync_listener(self._redis)
            self._tasks.append(asyncio.create_task(self._listener.run(), name="engine-resync"))

    async def _on_cleanup(self, _app: web.Application) -> None:
        # Loops that talk to Redis return on their own (cancelling a redis-py command
        # mid-flight can hang); the rest are cancelled; nothing is awaited forever.
        self._stopping = True
        if self._listener is not None:
            self._listener.stop()
        for t in self._tasks:
            if t.get_name() == "engine-step":  # pure waits: safe to cancel
                t.cancel()
        await stop_tasks(self._tasks, grace_s=2.0)
        self._tasks.clear()
        if self._publisher is not None:
            self._publisher.add(self.core.cache.drain_events(), int(time.time() * 1000))
            with contextlib.suppress(Exception):
                await self._publisher.flush()
        if self._bootstrap_runner is not None:
            await self._bootstrap_runner.cleanup()
        await self.remote_kv.close()
        if self._http is not None:
            await self._http.close()
        await self.prefetcher.close()
        if self.tier_io is not None:
            await self.tier_io.close()
        if self.kvbytes is not None:
            await self.kvbytes.close()
        if self._trace is not None:
            self._trace.close()

    def bind(self, port: int) -> None:
        """The HTTP port is known (it was 0 = any): fix the URL and, unless configured, the
        instance id (also in KV events not yet cut)."""
        self.url = f"http://{self.settings.host}:{port}"
        if not self.settings.instance_id:
            self.instance_id = f"{self.settings.host}:{port}"
            if self._publisher is not None:
                self._publisher.instance_id = self.instance_id

    # -- the stepping loop ---------------------------------------------------------------
    async def _step_loop(self) -> None:
        planned: float | None = None  # the previous step's modelled end (pacing.step_start)
        catch_up = self.settings.catch_up_ms * self.settings.speedup
        while True:
            stall = self.faults.stall_until - time.monotonic()
            if stall > 0:
                planned = None
                await asyncio.sleep(min(stall, 0.05))  # short slices: a new knob applies soon
                continue
            wall = self.now_ms()
            now = step_start(wall, planned, self._newest_arrival_ms, catch_up)
            res = self.core.step(now)
            if self.tier_io is not None:
                self.tier_io.answer(self.core, self._kick.set)
            filled = self.core.cache.drain_filled()
            if self.kvbytes is not None:
                self.kvbytes.fill(filled)  # before the outputs say the prompt is done
            if self.tier_io is not None:
                self.tier_io.written(filled)
                self.tier_io.evicted(self.core.cache.drain_evicted())
            if res is None:
                planned = None
                self._kick.clear()
                wake = self.core.next_wakeup(now)
                timeout = None if wake is None else self._real_s(wake - wall) + 1e-4
                await pause(self._kick, timeout)
                continue
            self._finishing = sum(1 for out in res.outputs if out.finished)
            if self._trace is not None:
                late = max(0.0, wall - planned) if planned is not None else 0.0
                self._trace.step(now, res, self.core.num_running, self.core.num_waiting, late)
            planned = now + res.duration_ms
            behind = self._real_s(planned - self.now_ms())
            # Behind schedule: no sleep, but let the streams and handlers run.
            await asyncio.sleep(behind)
            self._finishing = 0
            end = now + res.duration_ms
            if res.prefill_tokens:
                self._prefill_window.add(end, res.prefill_tokens)
            for out in res.outputs:
                self._deliver(out, end)
            if self._trace is not None:
                self._trace.outputs(end, res.outputs)
            if res.transferred:
                self.remote_kv.pulled(self._http, res.transferred)
            if self._publisher is None:
                self.core.cache.drain_events()

    def _deliver(self, out: SeqOutput, end: float) -> None:
        n = len(out.tokens)
        self.metrics.on_tokens(n)
        self._gen_window.add(end, n)
        live = self._live.get(out.rid)
        if live is None:
            return
        if live.first_ms is None:
            live.first_ms = end
            self.metrics.on_first_token((end - live.arrival_ms) / 1000.0)
            self.metrics.on_admitted(0, out.cached_tokens)
        elif n:
            self.metrics.on_inter_token((end - live.last_ms) / 1000.0 / n)
        live.last_ms = end
        if out.finished:
            live.done = True
            self.metrics.on_finished((end - live.arrival_ms) / 1000.0)
            if self.role is EngineRole.PREFILL:
                self.rendezvous.prefill_done(live.gen, out)
        live.queue.put_nowait(out)

    async def _event_loop(self) -> None:
        s = self.settings
        next_load = 0.0
        while not self._stopping:
            await asyncio.sleep(s.kv_flush_ms / 1000.0)
            self.rendezvous.expire()
            self._reap_gone()
            if self._publisher is None:
                continue
            self._publisher.cut(self.core.cache, int(time.time() * 1000), s.resync_max_blocks)
            await self._publisher.flush()
            if time.monotonic() >= next_load:
                next_load = time.monotonic() + s.load_interval_ms / 1000.0
                await self._publisher.publish_load(self.snapshot())

    def _reap_gone(self) -> None:
        """Cancel the handlers of requests whose client disconnected (their ``finally``
        aborts them in the core), e.g. a gateway pre-empting before the first byte."""
        for rid, (req, task) in list(self._conns.items()):
            if req.transport is None or req.transport.is_closing():
                self._conns.pop(rid, None)
                task.cancel()

    # -- load figures --------------------------------------------------------------------
    def figures(self) -> LoadFigures:
        now = self.now_ms()
        rates = (self._prefill_window.rate(now), self._gen_window.rate(now))
        return core_figures(self.core, self._finishing, *rates)

    def snapshot(self) -> Any:
        return load_snapshot(
            self.figures(),
            deployment=self.settings.deployment,
            instance_id=self.instance_id,
            epoch=self.epoch,
            ts_ms=int(time.time() * 1000),
            role=self.settings.role,
            url=self.url,
            bootstrap_host=self.settings.host if self.settings.bootstrap_port else "",
            bootstrap_port=self.settings.bootstrap_port,
        )

    # -- generation ----------------------------------------------------------------------
    async def _generate(self, req: web.Request) -> web.StreamResponse:
        return await self._handle(req, api.parse_generate)

    async def _completions(self, req: web.Request) -> web.StreamResponse:
        return await self._handle(req, api.parse_completion)

    async def _chat(self, req: web.Request) -> web.StreamResponse:
        return await self._handle(req, api.parse_chat)

    async def _handle(
        self,
        req: web.Request,
        parse: Any,
        body: Any = None,
        shape: respond.Shape | None = None,
    ) -> web.StreamResponse:
        """One generation request (``body``: already read and translated, with ``shape``
        the answer's API)."""
        entered = time.monotonic()
        try:
            body = await req.json() if body is None else body
        except (json.JSONDecodeError, UnicodeDecodeError):
            return bad_request("the request body is not valid JSON", code="invalid_json")
        try:
            gen: api.GenRequest = parse(body, self.settings.default_max_tokens, self.tokens)
            self.core.check(len(gen.prompt_ids), gen.max_new_tokens)
        except api.BadRequest as err:
            return bad_request(err.message, err.param, err.code)
        except AdmissionError as err:
            return bad_request(
                str(err), "messages" if gen.kind == "chat" else "prompt", "context_length_exceeded"
            )
        if self.faults.fail_rate and self._rng.random() < self.faults.fail_rate:
            return web.json_response(
                api.error_body("injected failure", "server_error", None, "fault"), status=500
            )
        rid = gen.rid if gen.rid and not self.core.knows(gen.rid) else uuid.uuid4().hex
        core_req = await self._core_request(rid, gen)
        if isinstance(core_req, web.Response):
            return core_req
        live = Live(rid, gen, self.now_ms())
        if self.pd_bytes is not None:
            live.kv = self.pd_bytes.take(rid)
        model = gen.model or self.settings.model
        self._live[rid] = live
        task = asyncio.current_task()
        if task is not None:
            self._conns[rid] = (req, task)
        try:
            self.core.submit(core_req, live.arrival_ms)
            self._newest_arrival_ms = max(self._newest_arrival_ms, live.arrival_ms)
            if self._trace is not None:
                held_ms = (time.monotonic() - entered) * 1000.0
                self._trace.submit(rid, live.arrival_ms, len(gen.prompt_ids), gen.max_new_tokens,
                                   held_ms)  # fmt: skip
            self.metrics.on_admitted(len(gen.prompt_ids), 0)
            self._kick.set()
            if gen.stream:
                return await respond.stream(
                    req,
                    live,
                    model,
                    self.settings.stream_interval,
                    self.faults.die_after_tokens,
                    shape,
                )
            sock = req.transport.get_extra_info("sockname") if req.transport else None
            host, port = (sock[0], int(sock[1])) if sock else (self.settings.host, 0)
            pd = self.pd_bytes

            def extra() -> dict[str, Any] | None:  # once the prompt's blocks are cached
                locate = (lambda: pd.locate(gen).to_json()) if pd else None
                kv = self.remote_kv.response_params(rid, gen, host, port, locate)
                return {"kv_transfer_params": kv} if kv is not None else None

            return await respond.unary(req, live, model, self.faults.die_after_tokens, extra, shape)
        except AdmissionError as err:
            return bad_request(str(err), None, "context_length_exceeded")
        finally:
            self._live.pop(rid, None)
            self._conns.pop(rid, None)
            self.remote_kv.finish(self._http, rid)
            if not live.done:
                self.core.abort(rid)

    async def _core_request(self, rid: str, gen: api.GenRequest) -> Request | web.Response:
        return await kv_source.core_request(
            rid, gen, self.role, self._http, self.remote_kv, self.rendezvous, self.pd_bytes,
            self.tier_io,
        )  # fmt: skip
