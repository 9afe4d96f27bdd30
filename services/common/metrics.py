"""Prometheus: exposition over aiohttp (no threads) and gRPC server call metrics.

``GET /metrics`` is served on ``metrics_port``. :class:`GrpcMetricsInterceptor` records
``tideserve_grpc_server_handled_total{grpc_service,grpc_method,grpc_code}``,
``tideserve_grpc_server_handling_seconds`` and ``tideserve_grpc_server_in_flight``.

Use :func:`metrics_handler` to add ``/metrics`` to an aiohttp app a service already runs (the
gateway), or :class:`MetricsServer` for a stand-alone listener.
"""

from __future__ import annotations

import asyncio
import errno
import inspect
import socket
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
from aiohttp import web
from prometheus_client import (
    GC_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from services.common.http_errors import JsonErrorRunner, json_errors

__all__ = [
    "GrpcMetricsInterceptor",
    "MetricsServer",
    "bind_tcp",
    "call_behavior",
    "is_port_in_use",
    "iterate_behavior",
    "metrics_handler",
    "service_registry",
    "wrap_rpc_handler",
]


def service_registry() -> CollectorRegistry:
    """A service's own Prometheus registry, with the process, platform and GC collectors
    the default registry would have had. Convention: each service builds one in ``main``
    (or its composition root) and passes it down; nothing registers in the process-global
    default registry, so two services or tests in one process never share metrics."""
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    registry.register(GC_COLLECTOR)
    return registry


def metrics_handler(
    registry: CollectorRegistry,
) -> Callable[[web.Request], Awaitable[web.Response]]:
    """An aiohttp handler answering with the text exposition of ``registry``."""

    async def handle(_request: web.Request) -> web.Response:
        body = generate_latest(registry)
        response = web.Response(body=body)
        response.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return response

    return handle


def bind_tcp(host: str, port: int) -> socket.socket:
    """A listening-ready TCP socket bound to ``host:port`` (0 = any free port).

    ``SO_REUSEADDR`` is set (restarts are not blocked by TIME_WAIT) but not ``SO_REUSEPORT``, so a
    port held by another process raises ``OSError`` with ``errno.EADDRINUSE``.
    """
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


def is_port_in_use(err: OSError) -> bool:
    """True when ``err`` is a bind failure because the address is taken."""
    return err.errno == errno.EADDRINUSE


class MetricsServer:
    """``GET /metrics`` for ``registry`` on ``host:port``; ``start`` raises ``OSError`` on bind."""

    def __init__(self, host: str, port: int, registry: CollectorRegistry) -> None:
        self.host = host
        self.port = port
        self._registry = registry
        self._runner: web.AppRunner | None = None

    async def start(self) -> int:
        """Bind and serve; returns the bound port (useful when ``port`` was 0)."""
        sock = bind_tcp(self.host, self.port)
        app = web.Application(middlewares=[json_errors()])
        app.router.add_get("/metrics", metrics_handler(self._registry))
        runner = JsonErrorRunner(app, access_log=None)
        await runner.setup()
        try:
            await web.SockSite(runner, sock).start()
        except BaseException:
            await runner.cleanup()
            sock.close()
            raise
        self._runner = runner
        self.port = int(sock.getsockname()[1])
        return self.port

    async def stop(self) -> None:
        """Stop listening; safe to call twice or before ``start``."""
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()


# --------------------------------------------------------------------------- gRPC server metrics

UnaryBehavior = Callable[[Any, Any], Awaitable[Any]]
StreamBehavior = Callable[[Any, Any], AsyncIterator[Any]]


def wrap_rpc_handler(
    handler: grpc.RpcMethodHandler,
    unary: Callable[[Callable[..., Any]], UnaryBehavior],
    stream: Callable[[Callable[..., Any]], StreamBehavior],
) -> grpc.RpcMethodHandler:
    """``handler`` with its behaviour wrapped: ``unary`` for single-response calls, ``stream``
    for streaming responses. Serializers and streaming shapes are kept."""
    kwargs = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(unary(handler.unary_unary), **kwargs)
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(unary(handler.stream_unary), **kwargs)
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(stream(handler.unary_stream), **kwargs)
    return grpc.stream_stream_rpc_method_handler(stream(handler.stream_stream), **kwargs)


async def call_behavior(behavior: Callable[..., Any], request: Any, context: Any) -> Any:
    """Call a unary-response behaviour that may be sync (generated bases) or async."""
    result = behavior(request, context)
    return (await result) if inspect.isawaitable(result) else result


async def iterate_behavior(
    behavior: Callable[..., Any], request: Any, context: Any
) -> AsyncIterator[Any]:
    """Iterate a streaming-response behaviour: async generator, sync iterable, or a coroutine
    that writes with ``context.write`` (yields nothing)."""
    result = behavior(request, context)
    if hasattr(result, "__aiter__"):
        async for item in result:
            yield item
    elif inspect.isawaitable(result):
        await result
    elif result is not None:
        for item in result:
            yield item


@dataclass(frozen=True)
class _GrpcFamilies:
    handled: Counter
    seconds: Histogram
    in_flight: Gauge


_FAMILIES: weakref.WeakKeyDictionary[CollectorRegistry, _GrpcFamilies] = weakref.WeakKeyDictionary()


def _families(registry: CollectorRegistry) -> _GrpcFamilies:
    # One set of families per registry: a registry refuses the same name twice, and several
    # servers may share one registry in a process (tests).
    found = _FAMILIES.get(registry)
    if found is None:
        found = _GrpcFamilies(
            handled=Counter(
                "tideserve_grpc_server_handled",
                "gRPC calls completed on the server, by final status code",
                ["grpc_service", "grpc_method", "grpc_code"],
                registry=registry,
            ),
            seconds=Histogram(
                "tideserve_grpc_server_handling_seconds",
                "gRPC call handling time on the server",
                ["grpc_service", "grpc_method"],
                registry=registry,
            ),
            in_flight=Gauge(
                "tideserve_grpc_server_in_flight",
                "gRPC calls being handled right now",
                ["grpc_service"],
                registry=registry,
            ),
        )
        _FAMILIES[registry] = found
    return found


def _split_method(full: str) -> tuple[str, str]:
    service, _, method = full.strip("/").partition("/")
    return service, method


def _final_code(context: Any, err: BaseException | None) -> str:
    if isinstance(err, asyncio.CancelledError):
        return str(grpc.StatusCode.CANCELLED.name)
    code = context.code()
    if isinstance(code, grpc.StatusCode):
        return str(code.name)
    if isinstance(code, int) and not isinstance(code, bool):
        return next((str(c.name) for c in grpc.StatusCode if c.value[0] == code), "UNKNOWN")
    return "OK" if err is None else "UNKNOWN"


class GrpcMetricsInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Counts calls by final status, times them and tracks in-flight calls in ``registry``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._families = _families(registry)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        service, method = _split_method(str(handler_call_details.method))
        families = self._families

        def finish(context: Any, started: float, err: BaseException | None) -> None:
            families.in_flight.labels(service).dec()
            families.seconds.labels(service, method).observe(time.perf_counter() - started)
            families.handled.labels(service, method, _final_code(context, err)).inc()

        def unary(behavior: Callable[..., Any]) -> UnaryBehavior:
            async def call(request: Any, context: Any) -> Any:
                families.in_flight.labels(service).inc()
                started = time.perf_counter()
                try:
                    response = await call_behavior(behavior, request, context)
                except BaseException as err:
                    finish(context, started, err)
                    raise
                finish(context, started, None)
                return response

            return call

        def stream(behavior: Callable[..., Any]) -> StreamBehavior:
            async def call(request: Any, context: Any) -> AsyncIterator[Any]:
                families.in_flight.labels(service).inc()
                started = time.perf_counter()
                try:
                    async for item in iterate_behavior(behavior, request, context):
                        yield item
                except BaseException as err:
                    finish(context, started, err)
                    raise
                finish(context, started, None)

            return call

        return wrap_rpc_handler(handler, unary, stream)
