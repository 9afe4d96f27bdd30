"""The gateway's dispatch order in front of one engine that records what reaches it.

The engine holds the first (long) prompt until the test lets it answer, so the next two
requests wait in the gateway (admission.shaper) and reach the engine in the configured
order. Free ports on 127.0.0.1, no Redis.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, Literal

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from services.common.scheduling import EndpointSpec, build_core
from services.scheduler.http.options import GatewayOptions
from services.scheduler.http.server import Gateway
from tests.helpers.engines import until

METRICS = 'sglang:num_running_reqs{model_name="m"} 0\nsglang:num_queue_reqs{model_name="m"} 0\n'


class RecordingEngine:
    """Answers completions, in arrival order on ``seen`` (each prompt's first word); a
    prompt starting with "a" is held until ``open`` is set."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.open = asyncio.Event()

    def app(self) -> web.Application:
        app = web.Application(client_max_size=8 * 1024 * 1024)
        app.router.add_get("/health", self.text(""))
        app.router.add_get("/metrics", self.text(METRICS))
        app.router.add_post("/v1/completions", self.complete)
        return app

    @staticmethod
    def text(body: str) -> Any:
        async def handler(_: web.Request) -> web.Response:
            return web.Response(text=body)

        return handler

    async def complete(self, req: web.Request) -> web.Response:
        body = await req.json()
        word = str(body["prompt"]).split(" ", 1)[0]
        self.seen.append(word[0])
        if word.startswith("a"):
            await self.open.wait()
        return web.json_response(
            {
                "id": "cmpl-1",
                "object": "text_completion",
                "model": "tideserve-sim",
                "choices": [{"index": 0, "text": "x", "finish_reason": "length"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }
        )


@pytest.fixture
async def engine() -> AsyncIterator[tuple[RecordingEngine, str]]:
    eng = RecordingEngine()
    server = TestServer(eng.app(), host="127.0.0.1")
    await server.start_server()
    yield eng, str(server.make_url("")).rstrip("/")
    eng.open.set()
    await server.close()


def _prompt(letter: str, words: int) -> str:
    return " ".join(f"{letter}{i}" for i in range(words))


@pytest.mark.parametrize(
    ("order", "slo_class", "b_words", "expect"),
    [
        # shortest predicted prefill first: the 1,000-word prompt overtakes the 8,000-word one
        ("shortest", "agent", 8_000, ["a", "c", "b"]),
        # deadlines first, by latest start: with the same 10 s target the longer prompt has
        # less slack and goes first
        ("slo", "agent", 8_000, ["a", "b", "c"]),
        # a prompt whose own prefill (~2.3 s) cannot meet interactive's 2 s target waits
        # behind one that can
        ("slo", "interactive", 40_000, ["a", "c", "b"]),
    ],
    ids=["shortest", "slo-least-slack", "slo-infeasible-last"],
)
async def test_requests_reach_the_engine_in_dispatch_order(
    engine: tuple[RecordingEngine, str],
    http: aiohttp.ClientSession,
    order: Literal["shortest", "slo"],
    slo_class: str,
    b_words: int,
    expect: list[str],
) -> None:
    eng, url = engine
    core = build_core([EndpointSpec("e1", url)], perf_profile="test", block_size=16)
    opts = GatewayOptions(
        background=False, block_size=16, dispatch_hold_ms=150.0, dispatch_order=order
    )
    gw = Gateway(core, opts)
    server = TestServer(gw.app(), host="127.0.0.1")
    await server.start_server()
    gw_url = str(server.make_url("")).rstrip("/")
    headers = {"X-Tideserve-Class": slo_class}

    async def send(letter: str, words: int) -> Any:
        body = {"model": "tideserve-sim", "prompt": _prompt(letter, words), "max_tokens": 1}
        async with http.post(gw_url + "/v1/completions", json=body, headers=headers) as r:
            assert r.status == 200, await r.text()
            return await r.json()

    try:
        first = asyncio.create_task(send("a", 8_000))  # ~466 ms of predicted prefill
        await until(lambda: eng.seen == ["a"], "the long prompt reached the engine")
        rest = [asyncio.create_task(send("b", b_words)), asyncio.create_task(send("c", 1_000))]
        await until(lambda: gw.dispatch.shaper.held("e1") == 2, "two requests wait in the gateway")
        assert eng.seen == ["a"]  # both wait in the gateway, not in the engine
        eng.open.set()
        await asyncio.gather(first, *rest)
        assert eng.seen == expect
        assert gw.dispatch.shaper.held() == 0
    finally:
        eng.open.set()
        await server.close()


@pytest.mark.parametrize(
    ("follow_ms", "held"),
    [(30_000.0, True), (0.0, False)],
    ids=["follow-waits-for-carrier", "off-goes-at-once"],
)
async def test_a_follower_waits_for_its_carriers_first_byte(
    engine: tuple[RecordingEngine, str], http: aiohttp.ClientSession, follow_ms: float, held: bool
) -> None:
    """A session's next turn (the whole previous prompt plus a few words) arrives while the
    previous one still prefills on the engine: with ``dispatch_follow_ms`` it waits in the
    gateway until that one answers (then its prefix is cached there); without, it goes at
    once (predicted as a cache hit, its prefill is too small to hold)."""
    eng, url = engine
    core = build_core([EndpointSpec("e1", url)], perf_profile="test", block_size=16)
    opts = GatewayOptions(
        background=False, block_size=16, dispatch_hold_ms=150.0, dispatch_follow_ms=follow_ms
    )
    gw = Gateway(core, opts)
    server = TestServer(gw.app(), host="127.0.0.1")
    await server.start_server()
    gw_url = str(server.make_url("")).rstrip("/")
    carrier = _prompt("a", 8_000)

    async def send(prompt: str) -> Any:
        body = {"model": "tideserve-sim", "prompt": prompt, "max_tokens": 1}
        async with http.post(gw_url + "/v1/completions", json=body) as r:
            assert r.status == 200, await r.text()
            return await r.json()

    try:
        first = asyncio.create_task(send(carrier))
        await until(lambda: eng.seen == ["a"], "the carrier reached the engine")
        follower = asyncio.create_task(send(carrier + " " + _prompt("z", 40)))
        if held:
            await until(lambda: gw.dispatch.shaper.held("e1") == 1, "the follower waits")
            assert eng.seen == ["a"]  # in the gateway, not in the engine
        else:
            await until(lambda: eng.seen == ["a", "a"], "the follower reached the engine")
        eng.open.set()  # the carrier answers
        await asyncio.gather(first, follower)
        assert eng.seen == ["a", "a"]
        assert gw.dispatch.shaper.held() == 0
    finally:
        eng.open.set()
        await server.close()


@pytest.mark.parametrize(
    ("protect", "held"),
    [("guard", True), ("off", False), ("auto", False)],
    ids=["guard-holds-until-first-byte", "off-goes-at-once", "auto-not-overloaded-goes"],
)
async def test_protection_holds_prompts_while_a_timely_one_awaits_its_first_byte(
    engine: tuple[RecordingEngine, str],
    http: aiohttp.ClientSession,
    protect: Literal["off", "guard", "auto"],
    held: bool,
) -> None:
    """The first prompt can meet the agent class's TTFT and has no first byte yet; once its
    predicted prefill has run out no backlog holds the next one, but protection does, until
    that first byte (the agent class's starve_after_ms bounds it); ``auto`` protects only
    while most requests were predicted late, and these two are not."""
    eng, url = engine
    core = build_core([EndpointSpec("e1", url)], perf_profile="test", block_size=16)
    opts = GatewayOptions(
        background=False, block_size=16, dispatch_hold_ms=150.0, dispatch_protect=protect
    )
    gw = Gateway(core, opts)
    server = TestServer(gw.app(), host="127.0.0.1")
    await server.start_server()
    gw_url = str(server.make_url("")).rstrip("/")
    headers = {"X-Tideserve-Class": "agent"}

    async def send(letter: str, words: int) -> Any:
        body = {"model": "tideserve-sim", "prompt": _prompt(letter, words), "max_tokens": 1}
        async with http.post(gw_url + "/v1/completions", json=body, headers=headers) as r:
            assert r.status == 200, await r.text()
            return await r.json()

    try:
        first = asyncio.create_task(send("a", 8_000))  # ~466 ms of predicted prefill
        await until(lambda: eng.seen == ["a"], "the timely prompt reached the engine")
        await until(lambda: gw.dispatch.shaper.backlog_ms("e1", gw.clock()) == 0.0, "no backlog")
        second = asyncio.create_task(send("b", 8_000))
        if held:
            await until(lambda: gw.dispatch.shaper.held("e1") == 1, "the next one waits")
            assert eng.seen == ["a"]
        else:
            await until(lambda: eng.seen == ["a", "b"], "the next one reached the engine")
        eng.open.set()  # the first prompt answers: its first byte
        await asyncio.gather(first, second)
        assert eng.seen == ["a", "b"] and gw.dispatch.shaper.held() == 0
    finally:
        eng.open.set()
        await server.close()
