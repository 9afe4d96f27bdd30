"""Pre-emption before the first byte, through the gateway, against a simulated engine
served as `tideserve engine` serves it (free port, 'test' profile)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from services.common.scheduling import CoreLimits, EndpointSpec, build_core
from services.engine.server import EngineServer
from services.scheduler.http.options import GatewayOptions
from services.scheduler.http.server import Gateway
from tests.helpers.engines import EngineFleet, sse, until


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[tuple[EngineServer, str, Gateway, str]]:
    """One engine and a gateway allowing one request in flight on it."""
    fleet = EngineFleet(tmp_path, serve="runner", profile="test", speedup=50.0, kv_flush_ms=10.0)
    engine, eurl = await fleet.start()
    core = build_core(
        [EndpointSpec("e1", eurl)],
        perf_profile="test",
        limits=CoreLimits(max_in_flight_per_endpoint=1),
    )
    gw = Gateway(core, GatewayOptions(background=False, block_size=16, backoff_ms=1))
    server = TestServer(gw.app(), host="127.0.0.1")
    await server.start_server()
    await gw.poll_load()
    yield engine, eurl, gw, str(server.make_url("")).rstrip("/")
    await server.close()
    await fleet.close()


def body(words: str, cls: str, max_tokens: int = 5) -> dict[str, Any]:
    return {
        "model": "tideserve-sim",
        "prompt": words,
        "max_tokens": max_tokens,
        "stream": True,
        "slo_class": cls,
    }


async def stream(http: aiohttp.ClientSession, url: str, req: dict[str, Any]) -> list[Any]:
    async with http.post(url + "/v1/completions", json=req) as r:
        assert r.status == 200, await r.text()
        return await sse(r)


async def fault(http: aiohttp.ClientSession, eurl: str, stall_s: float) -> None:
    async with http.post(eurl + "/fault", json={"stall_s": stall_s}) as r:
        assert r.status == 200


async def test_lower_class_not_yet_streaming_is_preempted_and_requeued(
    stack: tuple[EngineServer, str, Gateway, str],
) -> None:
    engine, eurl, gw, url = stack
    done: list[str] = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:
        await fault(http, eurl, 30)  # nothing is generated: no first byte for anyone

        async def run(name: str, req: dict[str, Any]) -> list[Any]:
            events = await stream(http, url, req)
            done.append(name)
            return events

        batch = asyncio.create_task(run("batch", body("a batch job " * 20, "batch")))
        await until(lambda: engine.core.num_waiting == 1, "the batch request reached the engine")
        inter = asyncio.create_task(run("interactive", body("hello there", "interactive")))
        # The batch dispatch is cancelled upstream (the engine aborts it) and requeued; the
        # interactive request takes its slot.
        await until(lambda: gw.preemptor.total == 1, "the batch request was pre-empted")
        await until(
            lambda: len(gw.core.queue) == 1 and engine.core.num_waiting == 1,
            "batch requeued at the gateway, only the interactive one on the engine",
        )
        assert not batch.done()
        await fault(http, eurl, 0)
        b_events, i_events = await asyncio.gather(batch, inter)
    assert done == ["interactive", "batch"]
    assert gw.metrics.value("tideserve_gateway_preemptions_total") == 1
    for events in (b_events, i_events):
        assert events[-1] == "[DONE]"
        usage = [e for e in events if isinstance(e, dict) and e.get("usage")][-1]["usage"]
        assert usage["completion_tokens"] == 5
    assert gw.core.fleet.in_flight("e1") == 0 and len(gw.core.queue) == 0
    assert engine.core.num_running == 0 and engine.core.cache.usage == 0.0


async def test_a_request_that_started_streaming_is_never_preempted(
    stack: tuple[EngineServer, str, Gateway, str],
) -> None:
    _, eurl, gw, url = stack
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:
        # Long enough that it is still streaming when the engine is stalled below.
        req = body("a batch job " * 20, "batch", max_tokens=5000)
        async with http.post(url + "/v1/completions", json=req) as r:
            assert r.status == 200
            first = await r.content.readline()  # its first byte reached us
            assert first.startswith(b"data: ")
            await fault(http, eurl, 30)  # stalled mid-stream
            inter = asyncio.create_task(stream(http, url, body("hello there", "interactive")))
            await until(lambda: len(gw.core.queue) == 1, "the interactive request is queued")
            gw.gate.pump()  # a pump with a higher class waiting and no capacity left
            assert gw.preemptor.total == 0 and gw.core.fleet.in_flight("e1") == 1
            await fault(http, eurl, 0)
            rest = await r.content.read()
        assert b"[DONE]" in rest
        events = await inter
    assert events[-1] == "[DONE]"
    assert gw.preemptor.total == 0 and gw.core.fleet.in_flight("e1") == 0
