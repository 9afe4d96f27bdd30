"""vLLM-style disaggregation between two in-process simulated engines (free ports): the
toy-proxy convention of ``kv_transfer_params``, the release notification, and aborts when
the client goes away before the first byte."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from services.common.tokens import tokenize
from tests.helpers.engines import EngineFactory, EngineFleet, sse, until

Factory = EngineFactory
LONG = " ".join(f"w{i}" for i in range(300))
PREFILL_PARAMS = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}


@pytest.fixture
async def make_engine(tmp_path: Path) -> AsyncIterator[Factory]:
    # Served like `tideserve engine` does (an AppRunner without handler cancellation; the
    # aiohttp TestServer would cancel handlers on disconnect and hide what the engine does).
    fleet = EngineFleet(tmp_path, serve="runner", profile="test", speedup=20.0, kv_flush_ms=10.0)
    yield fleet.start
    await fleet.close()


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/completions", {"prompt": LONG}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": LONG}]}),
    ],
    ids=["completions", "chat"],
)
async def test_prefill_then_decode_with_kv_transfer_params(
    make_engine: Factory, http: aiohttp.ClientSession, path: str, body: dict[str, Any]
) -> None:
    prefill, purl = await make_engine(role="prefill")
    decode, durl = await make_engine(role="decode")
    p_body = {**body, "max_tokens": 1, "stream": False, "kv_transfer_params": PREFILL_PARAMS}
    async with http.post(purl + path, json=p_body) as resp:
        assert resp.status == 200, await resp.text()
        p_out = await resp.json()
    kv = p_out["kv_transfer_params"]
    n_prompt = p_out["usage"]["prompt_tokens"]
    assert kv["do_remote_prefill"] is True and kv["do_remote_decode"] is False
    assert kv["remote_engine_id"] == prefill.instance_id
    assert kv["remote_port"] == int(purl.rsplit(":", 1)[1])
    assert len(kv["remote_block_ids"]) == -(-n_prompt // prefill.settings.block_size)
    assert prefill.core.prompt_tokens_total == n_prompt and prefill.core.num_held == 1

    d_body = {**body, "max_tokens": 5, "stream": True, "kv_transfer_params": kv}
    async with http.post(durl + path, json=d_body) as resp:
        assert resp.status == 200
        events = await sse(resp)
    assert events[-1] == "[DONE]"
    usage = [e for e in events if isinstance(e, dict) and e.get("usage")][-1]["usage"]
    assert usage["completion_tokens"] == 5
    assert usage["prompt_tokens_details"]["cached_tokens"] == n_prompt - 1
    assert decode.core.prompt_tokens_total == 1  # only the last prompt token is recomputed
    await until(lambda: prefill.core.num_held == 0, "the prefill freed the handed-off KV")
    assert prefill.core.cache.usage == 0.0 and decode.remote_kv.notified == 1


async def test_decode_without_blocks_to_pull_prefills_locally(
    make_engine: Factory, http: aiohttp.ClientSession
) -> None:
    decode, durl = await make_engine(role="decode")
    kv = {"do_remote_prefill": True, "remote_block_ids": [], "remote_host": None}
    body = {"prompt": LONG, "max_tokens": 2, "kv_transfer_params": kv}
    async with http.post(durl + "/v1/completions", json=body) as resp:
        assert resp.status == 200
        out = await resp.json()
    assert "kv_transfer_params" not in out
    assert decode.core.prompt_tokens_total == len(tokenize(LONG))


async def test_unclaimed_kv_is_freed_after_the_hold_timeout(
    make_engine: Factory, http: aiohttp.ClientSession
) -> None:
    prefill, purl = await make_engine(role="prefill", hold_timeout_s=0.2, speedup=1.0)
    body = {"prompt": "a b c", "max_tokens": 1, "kv_transfer_params": PREFILL_PARAMS}
    async with http.post(purl + "/v1/completions", json=body) as resp:
        assert resp.status == 200
    assert prefill.core.num_held == 1
    await until(lambda: prefill.core.num_held == 0, "the hold timeout freed the KV")


async def test_client_gone_before_first_byte_aborts_the_request(
    make_engine: Factory, http: aiohttp.ClientSession
) -> None:
    engine, url = await make_engine()
    async with http.post(url + "/fault", json={"stall_s": 30}):
        pass
    body = {"prompt": LONG, "max_tokens": 50, "stream": True}
    resp = await http.post(url + "/v1/completions", json=body)
    assert resp.status == 200  # headers only: nothing was generated (stalled)
    await until(lambda: engine.core.num_waiting == 1, "the request is queued")
    resp.close()  # the client goes away without reading a byte
    await until(lambda: engine.core.num_waiting == 0, "the engine aborted it")
    async with http.post(url + "/fault", json={"stall_s": 0}):
        pass
    assert engine.core.num_running == 0 and engine.core.cache.usage == 0.0
