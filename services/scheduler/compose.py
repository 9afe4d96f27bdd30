"""The scheduler's one composition root: settings → core, HTTP gateway, integrations, fleet
feeds and gRPC servicer, and their lifecycle.

Both entry points use it: ``python -m services.scheduler`` (:mod:`.main`, which also serves
the gRPC servicer) and ``tideserve gateway`` (:mod:`.cli`, which translates its flags into
:class:`SchedulerSettings` and serves the HTTP gateway alone). Every default that depends
on other settings (e.g. ``decode_can_prefill`` from ``pd_protocol``) is resolved here, once.

Construction does no I/O; :meth:`Scheduler.start` starts integrations and feeds and (when
asked) the HTTP listener, :meth:`Scheduler.stop` undoes it in reverse.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from functools import partial

from aiohttp import web
from opentelemetry.sdk.trace import TracerProvider
from prometheus_client import CollectorRegistry

from services.common import otel, runtime
from services.common.errors import StartupError
from services.common.http_errors import JsonErrorRunner
from services.common.metrics import service_registry
from services.common.perfmodel import DEFAULT_PROFILE, get_profile
from services.common.routing.config import ConfigError
from services.common.scheduling import CoreLimits, EndpointSpec, GatewayCore, build_core
from services.common.security.channels import ClientSecurity, aio_channel
from services.common.tokens import ModelDirError, token_path
from services.scheduler.core.perf_switch import PerfModelSwitch
from services.scheduler.feeds.fleet_feeds import FleetFeeds
from services.scheduler.feeds.integrations import Integrations
from services.scheduler.feeds.perf_model import PerfModelFeed
from services.scheduler.grpc.servicer import SchedulerServicer
from services.scheduler.http import records
from services.scheduler.http.metrics import GatewayMetrics
from services.scheduler.http.openai import Limits
from services.scheduler.http.options import GatewayOptions
from services.scheduler.http.server import Gateway
from services.scheduler.keys.build import key_gate
from services.scheduler.responses.store import PostgresResponseStore
from services.scheduler.settings import SchedulerSettings, parse_endpoint, split_bootstrap
from services.scheduler.slo import known_tenants, queue_config, slo_targets

__all__ = ["REPLICA_HEADER", "Scheduler", "build_gateway", "endpoint_specs", "perf_switch"]

REPLICA_HEADER = "x-tideserve-replica"
"""Response header naming the gateway replica that answered (its ``replica_id``)."""


def endpoint_specs(settings: SchedulerSettings) -> list[EndpointSpec]:
    """The static engines of ``settings.endpoints`` (``[ROLE=]URL[#bootstrap=PORT]``)."""
    out = []
    for item in settings.endpoints:
        base, port = split_bootstrap(item)
        iid, role, url = parse_endpoint(base)
        out.append(
            EndpointSpec(
                iid,
                url,
                role,  # type: ignore[arg-type]
                bootstrap_port=port,
                deployment=settings.deployment,
            )
        )
    return out


def perf_switch(settings: SchedulerSettings) -> PerfModelSwitch | None:
    """The switch between the static profile and telemetry's fit (``telemetry_address``
    set), else None. StartupError for an unknown ``perf_profile``."""
    if not settings.telemetry_address:
        return None
    try:
        static = get_profile(settings.perf_profile or DEFAULT_PROFILE)
    except KeyError as e:
        raise StartupError(f"perf_profile: {e}") from None
    return PerfModelSwitch(static, settings.perf_model_min_confidence)


def build_gateway(
    settings: SchedulerSettings,
    registry: CollectorRegistry | None = None,
    tracer_provider: TracerProvider | None = None,
    perf_model: PerfModelSwitch | None = None,
) -> tuple[GatewayCore, Gateway]:
    """The core and the HTTP gateway from settings; its metrics go to ``registry`` (None =
    a private one), its spans to ``tracer_provider`` (None = a private one exporting
    nothing); ``perf_model`` prices predicted TTFT instead of the static profile.
    StartupError for a bad profiles file or an unknown ``profile``."""
    try:
        core = build_core(
            endpoint_specs(settings),
            profiles=settings.profiles_file,
            seed=settings.seed,
            block_size=settings.block_size,
            perf_profile=settings.perf_profile,
            decode_can_prefill=settings.decode_computes_prompts(),
            limits=CoreLimits(max_in_flight_per_endpoint=settings.max_in_flight_per_endpoint),
            queue=queue_config(
                settings.slo_classes,
                default_class=settings.default_slo_class,
                tenants=settings.tenants,
                max_total=settings.queue_max_total,
            ),
            slo=slo_targets(settings.slo_classes),
            perf_model=perf_model,
            scrape_queue_estimate=settings.scrape_queue_estimate,
        )
    except (ConfigError, KeyError) as e:
        raise StartupError(f"scheduler profiles: {e}") from None
    if settings.profile and settings.profile not in core.scheduler.profiles:
        known = ", ".join(sorted(core.scheduler.profiles))
        raise StartupError(f"unknown profile {settings.profile!r} (known: {known})")
    try:
        tokens = token_path(settings.model_path, settings.hash_scheme)
    except ModelDirError as e:
        raise StartupError(f"model_path: {e}") from None
    opts = GatewayOptions(
        models=tuple(settings.models),
        deployment=settings.deployment,
        block_size=settings.block_size,
        retries=settings.retries,
        health_interval_s=settings.health_interval_s,
        load_interval_s=settings.load_interval_s,
        limits=Limits(
            max_body_bytes=settings.max_body_bytes,
            max_tokens=settings.max_output_tokens,
            default_max_tokens=min(Limits().default_max_tokens, settings.max_output_tokens),
            max_prompt_tokens=settings.max_prompt_tokens,
            max_messages=settings.max_messages,
            max_header_bytes=settings.max_header_bytes,
        ),
        tenants=known_tenants(settings.tenants),
        profile=settings.profile,
        pd_protocol=settings.pd_protocol,
        preemption=settings.preemption,
        dispatch_hold_ms=settings.dispatch_hold_ms,
        dispatch_age_weight=settings.dispatch_age_weight,
        dispatch_order=settings.dispatch_order,
        dispatch_follow_ms=settings.dispatch_follow_ms,
        dispatch_protect=settings.dispatch_protect,
        dispatch_protect_when_missed=settings.dispatch_protect_when_missed,
        forward_authorization=settings.forward_authorization,
        engine_api_key=settings.engine_api_key.get_secret_value(),
        tokens=tokens,
        record_tool_contents=settings.record_tool_contents,
        native_apis=frozenset(settings.native_apis),
        responses_retention_s=settings.responses_retention_s,
    )
    metrics = GatewayMetrics(registry)
    gateway = Gateway(
        core,
        opts,
        rng=random.Random(settings.seed + 1),
        metrics=metrics,
        tracer_provider=tracer_provider,
        keys=key_gate(settings, metrics.registry),
        response_store=PostgresResponseStore(settings.postgres_url)
        if settings.postgres_url
        else None,
    )
    return core, gateway


def _replica_header(
    replica_id: str,
) -> Callable[[web.Request, web.StreamResponse], Awaitable[None]]:
    """An ``on_response_prepare`` hook: every gateway response (streamed ones too) carries
    :data:`REPLICA_HEADER` unless a handler set it already."""

    async def add(request: web.Request, response: web.StreamResponse) -> None:
        response.headers.setdefault(REPLICA_HEADER, replica_id)

    return add


class Scheduler:
    """Everything the scheduler runs, wired from ``settings`` on one Prometheus registry
    (gateway, integrations, feeds; ``main`` adds the gRPC server's) and one tracer provider
    (``tracer_provider``, else one built from the tracing settings, owned and shut down by
    :meth:`stop`; ``main`` gives it to the gRPC server too). Raises :class:`StartupError`
    (:class:`SettingsError` for tracing) for settings that cannot work."""

    def __init__(
        self,
        settings: SchedulerSettings,
        registry: CollectorRegistry | None = None,
        tracer_provider: TracerProvider | None = None,
    ) -> None:
        self.settings = settings
        self.registry = registry if registry is not None else service_registry()
        self._own_provider = tracer_provider is None
        self.tracer_provider = tracer_provider or otel.configure_tracing(settings, "scheduler")
        self.perf_model = perf_switch(settings)
        self.core, self.gateway = build_gateway(
            settings, self.registry, self.tracer_provider, self.perf_model
        )
        # records, active-active, precise prefix lookups
        self.integrations = Integrations(settings, self.core, self.gateway, registry=self.registry)
        self.feeds = FleetFeeds(settings, self.gateway)  # load snapshots, membership
        self.servicer = SchedulerServicer(
            self.core,
            deployment=settings.deployment,
            block_size=settings.block_size,
            gate=self.gateway.gate,  # one admission queue for HTTP and gRPC
            records=self.integrations.sink.offer if self.integrations.sink else None,
            replica_id=self.integrations.replica_id,
            tokens=self.gateway.opts.tokens,
        )
        self._runner: web.AppRunner | None = None
        self.perf_feed: PerfModelFeed | None = None
        if self.perf_model is not None:
            self.perf_feed = PerfModelFeed(
                settings.telemetry_address,
                self.perf_model,
                deployment=settings.deployment,
                interval_s=settings.perf_model_refresh_s,
                channel=partial(aio_channel, security=ClientSecurity.of(settings)),
            )

    def app(self) -> web.Application:
        """The gateway's aiohttp app with the replica header."""
        app = self.gateway.app()
        app.on_response_prepare.append(_replica_header(self.integrations.replica_id))
        return app

    async def start(
        self, http: tuple[str, int, bool] | None = None, *, settle_heap: bool = False
    ) -> None:
        """Start integrations and feeds, then (``http`` = host, port, reuse_port) listen
        for HTTP; StartupError when the address is taken. ``settle_heap`` (the service
        processes, not embedders or tests): then :func:`services.common.runtime.settle_heap`
        (start-up's objects out of the collector's scans; ~5-20 % of a request's CPU)."""
        await self.integrations.start()
        await self.feeds.start()
        if self.perf_feed is not None:
            self.perf_feed.start()
        if http is not None:
            await self._listen(*http)
        if settle_heap:
            runtime.settle_heap()

    async def _listen(self, host: str, port: int, reuse: bool) -> None:
        # JSON errors also for what aiohttp answers itself (unparseable requests).
        runner = JsonErrorRunner(
            self.app(), handle_signals=False, access_log_class=records.AccessLogger
        )
        await runner.setup()
        try:
            await web.TCPSite(runner, host, port, reuse_port=reuse or None).start()
        except OSError as e:
            await runner.cleanup()
            raise StartupError(f"cannot listen on {host}:{port} (http): {e.strerror}") from None
        self._runner = runner

    async def stop(self) -> None:
        """Idempotent: the HTTP listener (in-flight requests get ``shutdown_grace_s``),
        then feeds and integrations."""
        runner, self._runner = self._runner, None
        if runner is not None:
            await asyncio.wait_for(runner.cleanup(), self.settings.shutdown_grace_s + 1.0)
        if self.perf_feed is not None:
            await self.perf_feed.stop()
        await self.feeds.stop()
        await self.integrations.stop()
        if self.gateway.keys is not None:
            await self.gateway.keys.close()
        if self._own_provider:
            self._own_provider = False  # stop is idempotent
            self.tracer_provider.shutdown()
