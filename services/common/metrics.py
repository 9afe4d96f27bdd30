"""Prometheus exposition over aiohttp (no threads): ``GET /metrics`` on ``metrics_port``.

Use :func:`metrics_handler` to add ``/metrics`` to an aiohttp app a service already runs (the
gateway), or :class:`MetricsServer` for a stand-alone listener.
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Awaitable, Callable

from aiohttp import web
from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

__all__ = ["MetricsServer", "bind_tcp", "is_port_in_use", "metrics_handler"]


def metrics_handler(
    registry: CollectorRegistry = REGISTRY,
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

    def __init__(self, host: str, port: int, registry: CollectorRegistry = REGISTRY) -> None:
        self.host = host
        self.port = port
        self._registry = registry
        self._runner: web.AppRunner | None = None

    async def start(self) -> int:
        """Bind and serve; returns the bound port (useful when ``port`` was 0)."""
        sock = bind_tcp(self.host, self.port)
        app = web.Application()
        app.router.add_get("/metrics", metrics_handler(self._registry))
        runner = web.AppRunner(app, access_log=None)
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
