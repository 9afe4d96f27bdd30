"""``python -m services.scheduler``: the scheduler service process.

One process serves the gRPC ``SchedulerService`` (on ``grpc_port``) and the OpenAI-compatible
HTTP gateway (on ``http_port``; 0 = off) over one shared core, so a decision, its reservation
and its release are the same whichever way it is asked. With ``http_reuse_port`` several
replicas listen on one HTTP address (SO_REUSEPORT); every gateway response names the replica
that answered in ``x-tideserve-replica``.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Sequence

import grpc
from aiohttp import web
from prometheus_client import CollectorRegistry

from services.common.errors import StartupError
from services.common.server import ServiceHooks, run_service
from services.common.tokens import ModelDirError, token_path
from services.scheduler.core import CoreLimits, EndpointSpec, GatewayCore, build_core
from services.scheduler.feeds.fleet_feeds import FleetFeeds
from services.scheduler.feeds.integrations import Integrations
from services.scheduler.grpc.servicer import SchedulerServicer, add_to_server
from services.scheduler.http.metrics import GatewayMetrics
from services.scheduler.http.openai import Limits
from services.scheduler.http.server import Gateway, GatewayOptions
from services.scheduler.routing.config import ConfigError
from services.scheduler.settings import SchedulerSettings, parse_endpoint
from services.scheduler.slo import known_tenants, queue_config, slo_targets

__all__ = ["REPLICA_HEADER", "build", "build_gateway", "main"]


def _specs(settings: SchedulerSettings) -> list[EndpointSpec]:
    out = []
    for item in settings.endpoints:
        iid, role, url = parse_endpoint(item)
        out.append(EndpointSpec(iid, url, role, deployment=settings.deployment))  # type: ignore[arg-type]
    return out


def build_gateway(
    settings: SchedulerSettings, registry: CollectorRegistry | None = None
) -> tuple[GatewayCore, Gateway]:
    """The core and the HTTP gateway from settings; its metrics go to ``registry`` (None =
    a private one). StartupError for a bad profiles file."""
    try:
        core = build_core(
            _specs(settings),
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
        )
    except (ConfigError, KeyError) as e:
        raise StartupError(f"scheduler profiles: {e}") from None
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
        limits=Limits(max_body_bytes=settings.max_body_bytes),
        tenants=known_tenants(settings.tenants),
        pd_protocol=settings.pd_protocol,
        preemption=settings.preemption,
        tokens=tokens,
    )
    metrics = GatewayMetrics(registry)
    return core, Gateway(core, opts, rng=random.Random(settings.seed + 1), metrics=metrics)


REPLICA_HEADER = "x-tideserve-replica"
"""Response header naming the gateway replica that answered (its ``replica_id``)."""


def _replica_header(
    replica_id: str,
) -> Callable[[web.Request, web.StreamResponse], Awaitable[None]]:
    """An ``on_response_prepare`` hook: every gateway response (streamed ones too) carries
    :data:`REPLICA_HEADER` unless a handler set it already."""

    async def add(request: web.Request, response: web.StreamResponse) -> None:
        response.headers.setdefault(REPLICA_HEADER, replica_id)

    return add


def build(settings: SchedulerSettings) -> ServiceHooks:
    """Wire the servicer and the HTTP gateway on one core from ``settings``; one Prometheus
    registry (gateway, integrations, gRPC server metrics) served at the gateway's
    ``/metrics`` and on ``metrics_port``."""
    registry = CollectorRegistry()
    core, gateway = build_gateway(settings, registry)
    # records, active-active, kvmeta lookups
    extras = Integrations(settings, core, gateway, registry=registry)
    feeds = FleetFeeds(settings, gateway)  # load snapshots, membership, autoscaler seed
    servicer = SchedulerServicer(
        core,
        deployment=settings.deployment,
        block_size=settings.block_size,
        prefix_lookup=extras.lookup,
        records=extras.sink.offer if extras.sink is not None else None,
        replica_id=extras.replica_id,
        tokens=gateway.opts.tokens,
    )
    runner: list[web.AppRunner] = []

    def register(server: grpc.aio.Server) -> list[str]:
        return [add_to_server(servicer, server)]

    async def on_start() -> None:
        await extras.start()
        await feeds.start()
        if settings.http_port == 0:
            return
        app = gateway.app()
        extras.install(app)
        app.on_response_prepare.append(_replica_header(extras.replica_id))
        r = web.AppRunner(app, handle_signals=False)
        await r.setup()
        try:
            reuse = settings.http_reuse_port or None
            await web.TCPSite(r, settings.host, settings.http_port, reuse_port=reuse).start()
        except OSError as e:
            await r.cleanup()
            raise StartupError(
                f"cannot listen on {settings.host}:{settings.http_port} (http): {e.strerror}"
            ) from None
        runner.append(r)

    async def on_stop() -> None:
        for r in runner:
            await asyncio.wait_for(r.cleanup(), settings.shutdown_grace_s + 1.0)
        await feeds.stop()
        await extras.stop()

    return ServiceHooks(register=register, on_start=on_start, on_stop=on_stop, registry=registry)


def main(argv: Sequence[str] | None = None) -> int:
    """Run until SIGTERM/SIGINT; 0 on a clean stop, 2 (one stderr line) if it cannot start."""
    return run_service(
        "scheduler",
        SchedulerSettings,
        build,
        argv,
        description="Tideserve scheduler: request admission, queues, routing decisions and the OpenAI-compatible gateway.",
    )
