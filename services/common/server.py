"""The grpc.aio service runner shared by every Tideserve service.

:func:`serve` runs one service until SIGTERM/SIGINT (or a ``stop`` event): gRPC health
(``grpc.health.v1``, overall ``""`` and each full service name), reflection, the OpenTelemetry
server interceptor, Prometheus ``/metrics`` and a graceful shutdown. :func:`run_service` is the
whole ``main`` of a service: flags → settings → logging → dependency checks → :func:`serve`,
with every startup failure reported as one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from opentelemetry.sdk.trace import TracerProvider
from prometheus_client import CollectorRegistry

from services.common import otel
from services.common.errors import PortInUseError, StartupError, one_line, report
from services.common.health import HealthService
from services.common.logs import configure_logging
from services.common.metrics import (
    GrpcMetricsInterceptor,
    MetricsServer,
    bind_tcp,
    call_behavior,
    is_port_in_use,
    iterate_behavior,
    service_registry,
    wrap_rpc_handler,
)
from services.common.security.access import AccessTable
from services.common.security.server import ServerSecurity, server_security
from services.common.settings import (
    ServiceSettings,
    add_common_arguments,
    load_settings,
    overrides_from_args,
)

__all__ = [
    "HealthService",
    "Register",
    "ServiceHooks",
    "check_dependencies",
    "redact_url",
    "run_service",
    "serve",
]

log = logging.getLogger(__name__)

Register = Callable[[grpc.aio.Server], Sequence[str]]
"""Adds servicers to the server; returns their full names (``tideserve.v1.KVMetaService``)."""

Hook = Callable[[], Awaitable[None]]
S = TypeVar("S", bound=ServiceSettings)

_SERVING: int = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING: int = health_pb2.HealthCheckResponse.NOT_SERVING
_HEALTH_NAME: str = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name


class _UnimplementedInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Turns the generated bases' ``NotImplementedError`` into a clean UNIMPLEMENTED status
    (instead of a logged traceback per call)."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        method = str(handler_call_details.method)

        async def unimplemented(context: Any, err: NotImplementedError) -> None:
            detail = str(err) or "Method not implemented!"
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"{method}: {detail}")

        def unary(behavior: Callable[..., Any]) -> Callable[[Any, Any], Awaitable[Any]]:
            async def call(request: Any, context: Any) -> Any:
                try:
                    return await call_behavior(behavior, request, context)
                except NotImplementedError as err:
                    await unimplemented(context, err)

            return call

        def stream(behavior: Callable[..., Any]) -> Callable[[Any, Any], AsyncIterator[Any]]:
            async def call(request: Any, context: Any) -> AsyncIterator[Any]:
                try:
                    async for item in iterate_behavior(behavior, request, context):
                        yield item
                except NotImplementedError as err:
                    await unimplemented(context, err)

            return call

        return wrap_rpc_handler(handler, unary, stream)


def _check_port_free(service: str, setting: str, host: str, port: int) -> None:
    if port == 0:
        return
    try:
        bind_tcp(host, port).close()
    except OSError as err:
        if is_port_in_use(err):
            raise PortInUseError(service, setting, host, port) from err
        raise StartupError(f"cannot bind {setting} {host}:{port}: {err.strerror}") from err


def _install_signals(stop: asyncio.Event) -> list[signal.Signals]:
    loop = asyncio.get_running_loop()
    installed: list[signal.Signals] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError, ValueError):
            continue  # not the main thread, or no signal support: rely on ``stop``
        installed.append(sig)
    return installed


async def serve(
    settings: ServiceSettings,
    service_name: str,
    register: Register,
    *,
    on_start: Hook | None = None,
    on_stop: Hook | None = None,
    ready: asyncio.Event | None = None,
    stop: asyncio.Event | None = None,
    tracer_provider: TracerProvider | None = None,
    registry: CollectorRegistry | None = None,
    access: Sequence[AccessTable] = (),
) -> None:
    """Run ``service_name`` until SIGTERM/SIGINT or ``stop`` is set, then shut down gracefully.

    Start: bind gRPC on ``settings.host:grpc_port`` (and ``/metrics`` on ``metrics_port`` if not
    0), health NOT_SERVING, ``on_start``, then health SERVING for ``""`` and every name
    ``register`` returned, then ``ready`` is set. Stop: health NOT_SERVING, no new calls,
    in-flight calls get ``shutdown_grace_s`` to finish, then ``on_stop``, then return.

    Raises :class:`PortInUseError` when a port is taken and :class:`StartupError` for other
    bind failures; nothing is left listening when it raises. ``registry``: the service's
    Prometheus registry (None = a private :func:`service_registry`). Security
    (:mod:`services.common.security`): TLS, token auth over ``access`` (the service's access
    tables; with ``auth.enabled`` a method in none of them is refused), list and message
    limits, and reflection only when ``settings.reflection``.
    """
    registry = registry if registry is not None else service_registry()
    stop = stop if stop is not None else asyncio.Event()
    own_provider = tracer_provider is None
    provider = tracer_provider or otel.configure_tracing(settings, service_name)
    host = settings.host
    _check_port_free(service_name, "grpc_port", host, settings.grpc_port)
    _check_port_free(service_name, "metrics_port", host, settings.metrics_port)
    security = _security(settings, access)
    server = _grpc_server(provider, registry, security)
    health = HealthService()
    names = _register(server, health, register, settings, access)
    for name in ["", *names]:
        await health.set(name, _NOT_SERVING)

    up = _Started()
    try:
        await _start(
            server, security, health, names, settings, service_name, registry, stop, on_start, up
        )
        if ready is not None:
            ready.set()
        await stop.wait()
        log.info("shutting down", extra={"grace_s": settings.shutdown_grace_s})
    finally:
        await _shut_down(
            server,
            health,
            settings.shutdown_grace_s if up.started else None,
            up.signals,
            on_stop if up.started else None,
            up.metrics,
            provider if own_provider else None,
        )
    log.info("stopped")


@dataclass
class _Started:
    """How far :func:`serve` got: what its shutdown has to undo."""

    metrics: MetricsServer | None = None
    signals: list[signal.Signals] = field(default_factory=list)
    started: bool = False


async def _start(
    server: grpc.aio.Server,
    security: ServerSecurity,
    health: HealthService,
    names: Sequence[str],
    settings: ServiceSettings,
    service_name: str,
    registry: CollectorRegistry,
    stop: asyncio.Event,
    on_start: Hook | None,
    up: _Started,
) -> None:
    """Bind gRPC and ``/metrics``, start, install the signal handlers, ``on_start``, then
    health SERVING; records in ``up`` what is to be undone."""
    host = settings.host
    grpc_port = _bind_grpc(server, security, service_name, host, settings.grpc_port)
    if settings.metrics_port:
        up.metrics = MetricsServer(host, settings.metrics_port, registry)
        await _start_metrics(up.metrics, service_name, host, settings.metrics_port)
    await server.start()
    up.started = True
    up.signals = _install_signals(stop)
    if on_start is not None:
        await on_start()
    for name in ["", *names]:
        await health.set(name, _SERVING)
    log.info(
        "serving",
        extra={
            "grpc": f"{host}:{grpc_port}",
            "metrics_port": up.metrics.port if up.metrics else 0,
            "services": list(names),
        },
    )


def _security(settings: ServiceSettings, access: Sequence[AccessTable]) -> ServerSecurity:
    """The server's TLS, token auth, limits and reflection rule (StartupError if bad)."""
    try:
        return server_security(
            settings.tls,
            settings.auth,
            settings.grpc_limits,
            access,
            reflection=settings.reflection,
        )
    except ValueError as err:
        raise StartupError(str(err)) from err


def _grpc_server(
    provider: TracerProvider, registry: CollectorRegistry, security: ServerSecurity
) -> grpc.aio.Server:
    """The grpc.aio server with its interceptors: traces, metrics, security, UNIMPLEMENTED."""
    return grpc.aio.server(
        interceptors=[
            otel.server_interceptor(provider),
            GrpcMetricsInterceptor(registry),
            *security.interceptors,
            _UnimplementedInterceptor(),
        ],
        options=[("grpc.so_reuseport", 0), *security.options],
    )


def _register(
    server: grpc.aio.Server,
    health: HealthService,
    register: Register,
    settings: ServiceSettings,
    access: Sequence[AccessTable],
) -> list[str]:
    """The service's servicers, health checking and (when on) reflection on ``server``;
    the names ``register`` returned."""
    names = list(register(server))
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    if settings.reflection:
        reflection.enable_server_reflection([*names, _HEALTH_NAME, reflection.SERVICE_NAME], server)
    uncovered = sorted(set(names) - {t.service for t in access})
    if settings.auth.enabled and uncovered:
        log.warning("no access table: every call refused", extra={"services": uncovered})
    return names


def _bind_grpc(
    server: grpc.aio.Server, security: ServerSecurity, service: str, host: str, port: int
) -> int:
    try:
        return security.bind(server, f"{host}:{port}")
    except RuntimeError as err:
        raise PortInUseError(service, "grpc_port", host, port) from err


async def _start_metrics(metrics: MetricsServer, service: str, host: str, port: int) -> None:
    try:
        await metrics.start()
    except OSError as err:
        if is_port_in_use(err):
            raise PortInUseError(service, "metrics_port", host, port) from err
        raise StartupError(f"cannot bind metrics_port: {err.strerror}") from err


async def _shut_down(
    server: grpc.aio.Server,
    health: HealthService,
    grace_s: float | None,
    signals: Sequence[signal.Signals],
    on_stop: Hook | None,
    metrics: MetricsServer | None,
    own_provider: TracerProvider | None,
) -> None:
    """Health NOT_SERVING, no new calls, ``grace_s`` for in-flight ones (None: the server
    never started), signal handlers removed, then ``on_stop`` (only once started), the
    metrics server and the provider this call made."""
    await health.shutdown()
    await server.stop(grace_s)
    loop = asyncio.get_running_loop()
    for sig in signals:
        loop.remove_signal_handler(sig)
    try:
        if on_stop is not None:
            await on_stop()
    finally:
        if metrics is not None:
            await metrics.stop()
        if own_provider is not None:
            own_provider.shutdown()


def redact_url(url: str) -> str:
    """``url`` with any password replaced by ``***`` (safe to print)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable url>"
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc}"))


def _name_setting(setting: str, url: str, err: BaseException) -> str:
    message = one_line(str(err)) or type(err).__name__
    if setting in message:
        return message
    if "cannot reach" in message:
        return f"{setting}: {message}"
    return f"cannot reach {setting} ({redact_url(url)}): {message}"


async def check_dependencies(settings: ServiceSettings, service: str) -> None:
    """Reach Postgres (then migrate schema ``service``) and Redis if their URLs are set.

    Raises :class:`StartupError` with one line naming the setting when one is unreachable or
    the migration fails.
    """
    if settings.postgres_url:
        from services.common import db

        url = settings.postgres_url
        try:
            await db.check_postgres(url)
        except (ConnectionError, OSError) as err:
            raise StartupError(_name_setting("postgres_url", url, err)) from err
        try:
            await asyncio.to_thread(db.migrate, url, service)
        except Exception as err:
            raise StartupError(
                f"migrating schema {service} at postgres_url ({redact_url(url)}) failed: "
                f"{one_line(str(err))}"
            ) from err
    if settings.redis_url:
        from services.common import streams

        url = settings.redis_url
        try:
            await streams.check_redis(url)
        except (ConnectionError, OSError) as err:
            raise StartupError(_name_setting("redis_url", url, err)) from err


@dataclass(frozen=True)
class ServiceHooks:
    """What a service contributes to :func:`serve`: its servicers and lifecycle hooks, and
    the Prometheus registry its metrics are in (served on ``metrics_port`` with the gRPC
    server's own). Convention: a service builds its registry in ``main`` and passes it
    down; nothing uses the process-global default registry."""

    register: Register
    on_start: Hook | None = None
    on_stop: Hook | None = None
    registry: CollectorRegistry = field(default_factory=service_registry)
    tracer_provider: TracerProvider | None = None
    """The service's tracer provider when it builds one itself (its ``on_stop`` shuts it
    down); None = :func:`serve` builds one from the settings for the gRPC server."""
    access: Sequence[AccessTable] = ()
    """The access tables of the services ``register`` adds (who may call which method)."""


def run_service(
    service: str,
    settings_cls: type[S],
    build: Callable[[S], ServiceHooks],
    argv: Sequence[str] | None = None,
    *,
    description: str = "",
) -> int:
    """The whole ``main`` of ``python -m services.<service>``; returns the exit code.

    0 after a clean shutdown; 2 with one ``tideserve-<service>: ...`` line on stderr for bad
    settings, an unreachable Postgres/Redis or a port in use.
    """
    parser = argparse.ArgumentParser(
        prog=f"python -m services.{service}",
        description=description or f"Tideserve {service} service",
    )
    add_common_arguments(parser)
    args = parser.parse_args(argv)
    try:
        settings = load_settings(settings_cls, service, args.config, overrides_from_args(args))
        configure_logging(settings.log_level, settings.log_format, service)

        async def amain() -> None:
            await check_dependencies(settings, service)
            hooks = build(settings)
            await serve(
                settings,
                service,
                hooks.register,
                on_start=hooks.on_start,
                on_stop=hooks.on_stop,
                registry=hooks.registry,
                tracer_provider=hooks.tracer_provider,
                access=hooks.access,
            )

        asyncio.run(amain())
    except StartupError as err:
        return report(service, err)
    except KeyboardInterrupt:  # a second Ctrl-C during shutdown
        return 130
    return 0
