"""The gateway in vLLM P/D mode (``pd_protocol="vllm"``) in front of a real prefill + decode
pair of simulated engines (free ports, 'test' profile), and routed-prefix hygiene when an
upstream fails before its first byte."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from services.common.routing.plugins.prefix import ApproxPrefix
from services.common.scheduling import EndpointSpec, build_core
from services.common.tokens import block_hashes, tokenize
from services.scheduler.http.options import GatewayOptions
from services.scheduler.http.server import Gateway
from tests.helpers.engines import EngineFactory, EngineFleet, sse, until
from tests.helpers.ports import free_port

Engines = EngineFactory
LONG = " ".join(f"w{i}" for i in range(600))  # over the P/D decider's 512-token threshold
# `threshold`: every long prompt is disaggregated (the default decider prices the two paths
# and keeps a cold prompt on an idle decode engine); these tests are about the P/D path.
VLLM = GatewayOptions(
    background=False, block_size=16, backoff_ms=1, pd_protocol="vllm", profile="threshold"
)


@pytest.fixture
async def engines(tmp_path: Path) -> AsyncIterator[Engines]:
    # served as `tideserve engine` serves (the engine itself notices a client that left)
    fleet = EngineFleet(tmp_path, serve="runner", profile="test", speedup=50.0)
    yield fleet.start
    await fleet.close()


@pytest.fixture
async def gateway() -> AsyncIterator[Callable[..., Awaitable[tuple[Gateway, str]]]]:
    servers: list[TestServer] = []

    async def make(specs: list[EndpointSpec], opts: GatewayOptions) -> tuple[Gateway, str]:
        gw = Gateway(build_core(specs, perf_profile="test"), opts)
        server = TestServer(gw.app(), host="127.0.0.1")
        await server.start_server()
        servers.append(server)
        await gw.poll_load()
        return gw, str(server.make_url("")).rstrip("/")

    yield make
    for s in servers:
        await s.close()


@pytest.mark.parametrize(
    ("path", "body", "prompt"),
    [
        ("/v1/completions", {"prompt": LONG}, LONG),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": LONG}]},
            "user: " + LONG,
        ),
    ],
    ids=["completions", "chat"],
)
async def test_streamed_requests_go_prefill_then_decode_with_kv_transfer_params(
    engines: Engines,
    gateway: Callable[..., Awaitable[tuple[Gateway, str]]],
    http: aiohttp.ClientSession,
    path: str,
    body: dict[str, Any],
    prompt: str,
) -> None:
    pe, pu = await engines(role="prefill")
    de, du = await engines(role="decode")
    gw, url = await gateway(
        [EndpointSpec("p", pu, role="prefill"), EndpointSpec("d", du, role="decode")], VLLM
    )
    n = len(tokenize(prompt))
    req = {"model": "tideserve-sim", **body, "max_tokens": 6, "stream": True}
    async with http.post(url + path, json=req) as r:
        assert r.status == 200, await r.text()
        events = await sse(r)
    assert events[-1] == "[DONE]" and not any("error" in e for e in events if isinstance(e, dict))
    usage = [e["usage"] for e in events if isinstance(e, dict) and e.get("usage")][-1]
    assert usage["completion_tokens"] == 6 and usage["prompt_tokens"] == n
    # Decided and documented: the decode side reports the handed-off prompt as cached
    # (prompt - 1: its last token is recomputed there), as vLLM's scheduler does.
    assert usage["prompt_tokens_details"]["cached_tokens"] == n - 1
    assert pe.core.prompt_tokens_total == n  # the prefill engine computed the prompt
    assert de.core.prompt_tokens_total == 1
    await until(lambda: pe.core.num_held == 0, "the prefill freed the KV after the hand-off")
    assert pe.core.cache.usage == 0.0 and de.remote_kv.notified == 1
    assert gw.core.fleet.in_flight("p") == 0 and gw.core.fleet.in_flight("d") == 0
    # A non-streamed request works the same way.
    async with http.post(url + path, json={**req, "stream": False}) as r:
        assert r.status == 200
        out = await r.json()
    assert out["usage"]["completion_tokens"] == 6 and "kv_transfer_params" not in out


async def test_prefill_failure_before_the_first_byte_is_retried(
    engines: Engines,
    gateway: Callable[..., Awaitable[tuple[Gateway, str]]],
    http: aiohttp.ClientSession,
) -> None:
    _, bad = await engines(role="prefill", fail_rate=1.0)
    de, du = await engines(role="decode")
    gw, url = await gateway(
        [EndpointSpec("p", bad, role="prefill"), EndpointSpec("d", du, role="decode")], VLLM
    )
    req = {"model": "tideserve-sim", "prompt": LONG, "max_tokens": 3, "stream": True}
    async with http.post(url + "/v1/completions", json=req) as r:
        assert r.status == 200
        assert (await sse(r))[-1] == "[DONE]"
    # The failed prefill was excluded; the retry ran decode-only (the decode prefilled).
    assert gw.metrics.upstream_errors.labels("p", "http_5xx")._value.get() == 1
    assert de.core.prompt_tokens_total == len(tokenize(LONG))


async def test_failed_pick_leaves_no_routed_prefix_entry(
    engines: Engines,
    gateway: Callable[..., Awaitable[tuple[Gateway, str]]],
    http: aiohttp.ClientSession,
) -> None:
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    _, good = await engines()
    opts = GatewayOptions(background=False, block_size=16, backoff_ms=1)
    # Ties go to the lowest instance id: the first pick is the dead engine.
    gw, url = await gateway([EndpointSpec("a-dead", dead), EndpointSpec("b-good", good)], opts)
    req = {"model": "tideserve-sim", "prompt": LONG, "max_tokens": 2}
    async with http.post(url + "/v1/completions", json=req) as r:
        assert r.status == 200
    assert gw.metrics.retries._value.get() == 1
    plugin = next(
        h for h in gw.core.scheduler.profiles["default"].post_pick if isinstance(h, ApproxPrefix)
    )
    hashes = block_hashes(list(tokenize(LONG)), 16)
    assert set(plugin.index.match(hashes, gw.clock())) == {"b-good"}
