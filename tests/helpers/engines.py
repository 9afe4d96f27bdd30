"""Simulated engines (:class:`services.engine.server.EngineServer`) served in process on free
127.0.0.1 ports, and helpers for talking to them over HTTP."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Literal

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestServer

from services.engine.server import EngineServer
from services.engine.settings import EngineSettings

__all__ = ["EngineFactory", "EngineFleet", "sse", "until"]

EngineFactory = Callable[..., Awaitable[tuple[EngineServer, str]]]
"""``start(**settings) -> (engine, "http://127.0.0.1:PORT")`` as a fixture yields it."""


class EngineFleet:
    """Starts engines with ``EngineSettings(port=0, state_dir=<root>/e<n>, **defaults, **kw)``
    and stops them all in ``close()`` (start order).

    ``serve="test_server"``: an aiohttp ``TestServer`` (it cancels a handler whose client
    disconnects). ``serve="runner"``: an ``AppRunner`` + ``TCPSite`` without signal handling,
    as ``tideserve engine`` serves, so the engine itself must notice a client that went away.
    """

    def __init__(
        self,
        state_root: Path,
        *,
        serve: Literal["test_server", "runner"] = "test_server",
        **defaults: Any,
    ) -> None:
        self.state_root = state_root
        self.serve = serve
        self.defaults = defaults
        self._servers: list[TestServer] = []
        self._runners: list[web.AppRunner] = []

    async def start(self, redis: Any = None, **kw: Any) -> tuple[EngineServer, str]:
        """One more engine (``redis``: a ``redis.asyncio.Redis`` for KV events and load
        snapshots); returns it and its base URL (no trailing slash)."""
        n = len(self._servers) + len(self._runners)
        settings = EngineSettings(
            port=0, state_dir=self.state_root / f"e{n}", **{**self.defaults, **kw}
        )
        engine = EngineServer(settings, redis=redis)
        if self.serve == "runner":
            runner = web.AppRunner(engine.app(), handle_signals=False)
            await runner.setup()
            self._runners.append(runner)
            await web.TCPSite(runner, "127.0.0.1", 0).start()
            return engine, f"http://127.0.0.1:{runner.addresses[0][1]}"
        server = TestServer(engine.app(), host="127.0.0.1")
        await server.start_server()
        self._servers.append(server)
        return engine, str(server.make_url("")).rstrip("/")

    async def close(self) -> None:
        for server in self._servers:
            await server.close()
        for runner in self._runners:
            await runner.cleanup()
        self._servers.clear()
        self._runners.clear()


async def sse(resp: aiohttp.ClientResponse) -> list[Any]:
    """The ``data:`` payloads of an SSE body, JSON-decoded; ``"[DONE]"`` stays a string."""
    out: list[Any] = []
    async for raw in resp.content:
        line = raw.decode().strip()
        if line.startswith("data: "):
            data = line[len("data: ") :]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


async def until(cond: Callable[[], bool], what: str) -> None:
    """Poll ``cond`` every 10 ms, up to 1000 times; AssertionError naming ``what`` if it
    never holds."""
    for _ in range(1000):
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never happened: {what}")
