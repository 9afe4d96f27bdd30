"""The gateway's Authorization towards engines (started with --api-key): the client's
header passed on (``forward_authorization``) or a fixed ``engine_api_key``; by default
none. And no cookie an engine set rides on later requests. Against a fake engine that
records the headers it gets."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from services.common.scheduling import EndpointSpec, build_core
from services.scheduler.http.options import GatewayOptions
from services.scheduler.http.server import Gateway

Stack = Callable[..., Awaitable[tuple[str, list[str | None]]]]


def _engine(seen: list[str | None], header: str = "Authorization") -> web.Application:
    """Records ``header`` of each request; answers 401 without an accepted Authorization
    (any request passes when recording another header), and sets a cookie."""

    async def completions(req: web.Request) -> web.Response:
        seen.append(req.headers.get(header))
        if header == "Authorization" and req.headers.get(header) not in (
            "Bearer engine-key",
            "Bearer client-key",
        ):
            return web.json_response({"error": {"message": "unauthorized"}}, status=401)
        usage = {"prompt_tokens": 2, "completion_tokens": 1}
        resp = web.json_response({"choices": [{"text": "x"}], "usage": usage})
        resp.set_cookie("engine-session", "abc")
        return resp

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    return app


@pytest.fixture
async def stack() -> AsyncIterator[Stack]:
    servers: list[TestServer] = []

    async def make(header: str = "Authorization", **opts: Any) -> tuple[str, list[str | None]]:
        seen: list[str | None] = []
        engine = TestServer(_engine(seen, header), host="127.0.0.1")
        await engine.start_server()
        servers.append(engine)
        # By name, as in a cluster (aiohttp's default jar keeps no cookie of an IP address).
        base = f"http://localhost:{engine.port}"
        core = build_core(
            [EndpointSpec("e1", base)],
            perf_profile="test",
            block_size=16,
        )
        gw = Gateway(core, GatewayOptions(background=False, block_size=16, retries=0, **opts))
        gs = TestServer(gw.app(), host="127.0.0.1")
        await gs.start_server()
        servers.append(gs)
        return str(gs.make_url("")).rstrip("/"), seen

    yield make
    for s in servers:
        await s.close()


BODY = {"model": "m", "prompt": "hello world", "max_tokens": 1}


async def _post(url: str, auth: str | None) -> int:
    headers = {"Authorization": auth} if auth else {}
    async with (
        aiohttp.ClientSession() as http,
        http.post(url + "/v1/completions", json=BODY, headers=headers) as r,
    ):
        await r.read()
        return r.status


async def test_client_authorization_is_not_forwarded_by_default(stack: Stack) -> None:
    url, seen = await stack()
    assert await _post(url, "Bearer client-key") == 401
    assert seen == [None]


async def test_client_authorization_is_forwarded_when_configured(stack: Stack) -> None:
    url, seen = await stack(forward_authorization=True)
    assert await _post(url, "Bearer client-key") == 200
    assert await _post(url, None) == 401  # nothing to forward
    assert seen == ["Bearer client-key", None]


async def test_engine_api_key_is_sent_and_overrides_the_client(stack: Stack) -> None:
    url, seen = await stack(engine_api_key="engine-key", forward_authorization=True)
    assert await _post(url, "Bearer client-key") == 200
    assert await _post(url, None) == 200
    assert seen == ["Bearer engine-key", "Bearer engine-key"]


async def test_a_cookie_an_engine_set_is_not_sent_with_later_requests(stack: Stack) -> None:
    url, seen = await stack(header="Cookie")
    assert await _post(url, None) == 200
    assert await _post(url, None) == 200
    assert seen == [None, None]
