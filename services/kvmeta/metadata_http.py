"""Mooncake Transfer Engine HTTP metadata protocol, served by kvmeta (aiohttp).

``GET /metadata?key=K`` → 200 with the stored bytes, 404 if absent;
``PUT /metadata?key=K`` (body = value) → 200, except 400 for an existing ``.../rpc_meta/...``
key (as Mooncake's own server: a second engine cannot take over a live segment name);
``DELETE /metadata?key=K`` → 200, 404 if absent.
A missing ``key`` is 400; a body over ``max_value_bytes`` is 413. With ``middlewares``
(kvmeta passes services.common.security.http's token check when ``auth.enabled``, see
:data:`services.kvmeta.access.METADATA_ACCESS`) writes need an operator token. Values are opaque bytes
(the Transfer Engine stores JSON segment descriptors and RPC endpoints). The store is in
memory: transfer engines re-register on start, as with Mooncake's own metadata server.

Standalone (tests, benchmarks; kvmeta itself serves it on ``metadata_http_port``):
``python -m services.kvmeta.metadata_http [--host 127.0.0.1] --port 8081``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Sequence
from typing import Any

from aiohttp import web

__all__ = ["MetadataServer", "MetadataStore"]


class MetadataStore:
    """Pure key → bytes map."""

    def __init__(self) -> None:
        self._data: dict[str, bytes] = {}

    def get(self, key: str) -> bytes | None:
        return self._data.get(key)

    def put(self, key: str, value: bytes) -> bool:
        """Store ``value``; False (nothing changed) for an existing ``rpc_meta`` key."""
        if "rpc_meta/" in key and key in self._data:
            return False
        self._data[key] = value
        return True

    def delete(self, key: str) -> bool:
        return self._data.pop(key, None) is not None

    def __len__(self) -> int:
        return len(self._data)


def _error(status: int, message: str, code: str) -> web.Response:
    body = {
        "error": {"message": message, "type": "invalid_request_error", "param": "key", "code": code}
    }
    return web.Response(status=status, text=json.dumps(body), content_type="application/json")


class MetadataServer:
    """The HTTP endpoint; ``port`` 0 binds a free port (see ``bound_port`` after start)."""

    def __init__(
        self,
        host: str,
        port: int,
        store: MetadataStore | None = None,
        max_value_bytes: int = 16 << 20,
        middlewares: Sequence[Any] = (),
    ) -> None:
        self.middlewares = tuple(middlewares)
        self.host = host
        self.port = port
        self.store = store or MetadataStore()
        self.max_value_bytes = max_value_bytes
        self.bound_port = 0
        self._runner: web.AppRunner | None = None

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.max_value_bytes, middlewares=self.middlewares)
        app.router.add_get("/metadata", self._get)
        app.router.add_put("/metadata", self._put)
        app.router.add_delete("/metadata", self._delete)
        return app

    async def start(self) -> None:
        self._runner = web.AppRunner(self.app(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        server = site._server
        sockets = getattr(server, "sockets", None) or []
        self.bound_port = sockets[0].getsockname()[1] if sockets else self.port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _get(self, request: web.Request) -> web.StreamResponse:
        key = request.query.get("key")
        if not key:
            return _error(400, "query parameter 'key' is required", "missing_key")
        value = self.store.get(key)
        if value is None:
            return _error(404, "metadata not found", "not_found")
        return web.Response(body=value, content_type="application/json")

    async def _put(self, request: web.Request) -> web.StreamResponse:
        key = request.query.get("key")
        if not key:
            return _error(400, "query parameter 'key' is required", "missing_key")
        if request.content_length is not None and request.content_length > self.max_value_bytes:
            return _error(413, f"value larger than {self.max_value_bytes} bytes", "too_large")
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return _error(413, f"value larger than {self.max_value_bytes} bytes", "too_large")
        if not self.store.put(key, body):
            return _error(400, "Duplicate rpc_meta key not allowed", "duplicate_key")
        return web.Response(text="metadata updated")

    async def _delete(self, request: web.Request) -> web.StreamResponse:
        key = request.query.get("key")
        if not key:
            return _error(400, "query parameter 'key' is required", "missing_key")
        if not self.store.delete(key):
            return _error(404, "metadata not found", "not_found")
        return web.Response(text="metadata deleted")


async def _serve_forever(host: str, port: int) -> None:
    server = MetadataServer(host, port)
    await server.start()
    try:
        await asyncio.Event().wait()
    finally:
        await server.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m services.kvmeta.metadata_http",
        description="Serve only kvmeta's Mooncake metadata endpoint (in memory) until killed.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8081)
    args = parser.parse_args(argv)
    asyncio.run(_serve_forever(args.host, args.port))


if __name__ == "__main__":
    main()
