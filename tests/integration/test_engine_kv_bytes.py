"""Simulated engines holding real KV bytes (``kv_data_plane``) and P/D hand-offs that move
them over the real Mooncake Transfer Engine (TCP on loopback; kvmeta's metadata endpoint in
a child process): cached blocks hold their deterministic contents, the decode side pulls and
verifies the prefill's blocks (SGLang bootstrap and vLLM ``kv_transfer_params``), and a pull
that fails (unknown segment, wrong bytes, mismatched block size) recomputes: the same answer,
no hung request, and the prefill frees its KV.

Two engines in this test process, each with its own Transfer Engine; the same flow between
two engine processes is in tests/integration/test_engine_kv_bytes_process.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from services.common.dataplane.blocks import block_content
from services.common.tokens import block_hashes, tokenize
from tests.helpers.dataplane import metadata_url_or_skip
from tests.helpers.engines import EngineFactory, EngineFleet, until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

LONG = " ".join(f"w{i}" for i in range(700))  # 10 full blocks of 64 tokens + a tail
PREFILL_PARAMS = {"do_remote_decode": True, "do_remote_prefill": False}


@pytest.fixture(scope="module")
def metadata_url() -> Iterator[str]:
    yield from metadata_url_or_skip()


@pytest.fixture
async def make_engine(tmp_path: Path, metadata_url: str) -> AsyncIterator[EngineFactory]:
    fleet = EngineFleet(
        tmp_path,
        serve="runner",
        profile="test",
        speedup=20.0,
        kv_flush_ms=10.0,
        kv_data_plane=True,
        te_metadata_url=metadata_url,
    )
    yield fleet.start
    await fleet.close()


async def _post(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> dict[str, Any]:
    async with http.post(url, json=body) as resp:
        assert resp.status == 200, await resp.text()
        out: dict[str, Any] = await resp.json()
        return out


async def test_cached_blocks_hold_their_contents(
    make_engine: EngineFactory, http: aiohttp.ClientSession
) -> None:
    engine, url = await make_engine()
    await _post(http, url + "/v1/completions", {"prompt": LONG, "max_tokens": 1})
    kvb = engine.kvbytes
    assert kvb is not None and kvb.arena is not None
    hashes = block_hashes(tokenize(LONG), engine.settings.block_size)
    assert len(hashes) == 10
    for h in hashes:
        slot = engine.core.cache.slot_of(h)
        assert slot is not None
        got = kvb.arena.read(slot * kvb.block_bytes, kvb.block_bytes)
        assert got == block_content(h, kvb.block_bytes)


async def test_sglang_hand_off_moves_verified_bytes(
    make_engine: EngineFactory, http: aiohttp.ClientSession
) -> None:
    prefill, purl = await make_engine(role="prefill")
    decode, durl = await make_engine(role="decode")
    body = {
        "prompt": LONG,
        "max_tokens": 4,
        "bootstrap_host": "127.0.0.1",
        "bootstrap_port": int(purl.rsplit(":", 1)[1]),
        "bootstrap_room": 77,
    }
    p_out, d_out = await asyncio.gather(
        _post(http, purl + "/v1/completions", body), _post(http, durl + "/v1/completions", body)
    )
    assert p_out["usage"]["completion_tokens"] == 1
    assert d_out["usage"]["completion_tokens"] == 4
    assert d_out["usage"]["kv_transfer_ms"] > 0  # measured, reported for the record
    assert decode.pd_bytes is not None and decode.kvbytes is not None
    assert (decode.kvbytes.pulls_ok, decode.kvbytes.pulls_failed) == (1, 0)
    assert decode.kvbytes.plane.bytes_moved == 10 * decode.kvbytes.block_bytes
    assert d_out["usage"]["kv_transfer_bytes"] == decode.kvbytes.plane.bytes_moved
    assert "kv_transfer_failed" not in d_out["usage"]
    assert decode.core.prompt_tokens_total == 0  # nothing recomputed
    await until(lambda: prefill.core.num_held == 0, "the decode's notification freed the KV")
    async with http.get(durl + "/metrics") as resp:
        metrics = await resp.text()
    assert 'tideserve:kv_pulls_total{model_name="tideserve-sim",outcome="ok"} 1.0' in metrics
    assert 'tideserve:kv_pull_bytes_total{model_name="tideserve-sim"} 10240.0' in metrics


async def test_vllm_hand_off_moves_verified_bytes(
    make_engine: EngineFactory, http: aiohttp.ClientSession
) -> None:
    prefill, purl = await make_engine(role="prefill")
    decode, durl = await make_engine(role="decode")
    p_body = {"prompt": LONG, "max_tokens": 1, "kv_transfer_params": PREFILL_PARAMS}
    kv = (await _post(http, purl + "/v1/completions", p_body))["kv_transfer_params"]
    loc = kv["tideserve_kv"]
    assert prefill.kvbytes is not None
    assert loc["segment"] == prefill.kvbytes.plane.segment and len(loc["addrs"]) == 10
    d_out = await _post(
        http, durl + "/v1/completions", {"prompt": LONG, "max_tokens": 3, "kv_transfer_params": kv}
    )
    assert d_out["usage"]["kv_transfer_ms"] > 0
    assert decode.kvbytes is not None and decode.kvbytes.pulls_ok == 1
    assert decode.core.prompt_tokens_total == 1  # only the last prompt token, as vLLM
    await until(lambda: prefill.core.num_held == 0, "the decode's notification freed the KV")


def _ghost(loc: dict[str, Any]) -> dict[str, Any]:
    return {**loc, "segment": "127.0.0.1:1"}  # no such segment in kvmeta


def _shifted(loc: dict[str, Any]) -> dict[str, Any]:
    return {**loc, "addrs": loc["addrs"][1:] + loc["addrs"][:1]}  # real blocks, wrong order


def _resized(loc: dict[str, Any]) -> dict[str, Any]:
    return {**loc, "block_bytes": loc["block_bytes"] * 2}


@pytest.mark.parametrize(
    "spoil", [_ghost, _shifted, _resized], ids=["unknown-segment", "wrong-bytes", "block-size"]
)
async def test_failed_pull_recomputes_the_same_answer(
    make_engine: EngineFactory, http: aiohttp.ClientSession, spoil: Any
) -> None:
    prefill, purl = await make_engine(role="prefill")
    decode, durl = await make_engine(role="decode")
    _reference, rurl = await make_engine()  # aggregated: the answer without any hand-off
    want = await _post(http, rurl + "/v1/completions", {"prompt": LONG, "max_tokens": 5})

    p_body = {"prompt": LONG, "max_tokens": 1, "kv_transfer_params": PREFILL_PARAMS}
    kv = (await _post(http, purl + "/v1/completions", p_body))["kv_transfer_params"]
    kv = {**kv, "tideserve_kv": spoil(kv["tideserve_kv"])}
    got = await _post(
        http, durl + "/v1/completions", {"prompt": LONG, "max_tokens": 5, "kv_transfer_params": kv}
    )
    assert got["choices"][0]["text"] == want["choices"][0]["text"]
    assert "kv_transfer_ms" not in got["usage"]
    assert got["usage"]["kv_transfer_failed"] is True  # for the record: it recomputed
    assert decode.pd_bytes is not None and decode.pd_bytes.recomputed == 1
    async with http.get(durl + "/metrics") as resp:
        metrics = await resp.text()
    assert (
        'tideserve:kv_pulls_total{model_name="tideserve-sim",outcome="recomputed"} 1.0' in metrics
    )
    assert decode.core.prompt_tokens_total == len(tokenize(LONG))  # recomputed here
    await until(lambda: prefill.core.num_held == 0, "the 'aborted' notification freed the KV")
