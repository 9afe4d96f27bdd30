"""A real vLLM's KV events through the kv-bridge into kvmeta's index: eviction
(``BlockRemoved``) is forgotten, a gap is filled from vLLM's real replay socket, and an engine
restart drops the stale blocks before the restarted engine answers its first request.

One small engine (a pool of 24 blocks of 128 tokens) serves this module; its tests run in
order and the last one restarts it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import redis.asyncio as aioredis
from tideserve.v1 import events_pb2

from services.common.streams import decode_entry
from tests.helpers.vllm import MODEL_NAME, VLLMServer
from tests.helpers.waits import eventually
from tests.real_engines._front import Front, front, running_bridge


def prompt(seed: int, words: int = 180) -> dict[str, Any]:
    text = " ".join(f"w{(i * 31 + seed * 7) % 1000}" for i in range(words))
    return {"model": MODEL_NAME, "messages": [{"role": "user", "content": text}], "max_tokens": 1}


async def post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    async with (
        aiohttp.ClientSession() as http,
        http.post(url + "/v1/chat/completions", json=body) as r,
    ):
        answer = await r.json(content_type=None)
        assert r.status == 200, answer
        return dict(answer)


async def wait_held(f: Front, server: VLLMServer, hashes: list[int], blocks: int) -> None:
    async def held() -> bool:
        return f.held(server, hashes) == blocks

    await eventually(held, within_s=30)


async def test_evicted_blocks_are_forgotten(
    vllm_small: VLLMServer, redis_url: str, real_model: Path
) -> None:
    async with front([vllm_small], redis_url, real_model) as f:
        first = prompt(1)
        await post(vllm_small.url, first)
        hashes = f.hashes(first)
        assert len(hashes) >= 3
        await wait_held(f, vllm_small, hashes, len(hashes))
        # distinct prompts of as many blocks again fill the 24-block pool: LRU evicts
        for seed in range(2, 12):
            await post(vllm_small.url, prompt(seed))
        await wait_held(f, vllm_small, hashes, 0)
        removed = [
            e
            for b in await f.kv_batches()
            for e in b.events
            if e.kind == events_pb2.KVEvent.KIND_BLOCK_REMOVED
        ]
    assert removed
    again = await post(vllm_small.url, first)
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # vLLM agrees


async def test_gap_is_filled_from_vllms_replay(
    vllm_small: VLLMServer, redis_url: str, real_model: Path
) -> None:
    """The bridge is away while the engine stores blocks; back, it replays them from vLLM's
    replay socket (its real four-frame answers) in the same epoch, with nothing dead-lettered."""
    async with front([vllm_small], redis_url, real_model) as f:
        body = prompt(40)
        await post(vllm_small.url, body)
        hashes = f.hashes(body)
        await wait_held(f, vllm_small, hashes, len(hashes))
        redis = aioredis.Redis.from_url(redis_url)
        try:
            # a second bridge of the same instance, started after the events: all it can
            # know of them comes from the replay socket
            async with running_bridge(redis, redis_url, f.prefix + "x", vllm_small) as late:

                async def caught_up() -> bool:
                    return late.stats.replayed > 0 and not late.core.replaying

                await eventually(caught_up, within_s=30)
                stream = f"{f.prefix}x:kv:tiny"
                dead = await redis.xrange(stream + ":dead")
                stored = {
                    h for _, fields in await redis.xrange(stream) for h in _stored_hashes(fields)
                }
        finally:
            await redis.aclose()
    assert dead == []
    assert late.stats.dead_lettered == 0 and late.core.stats.new_epochs == 0
    assert set(hashes) <= stored


def _stored_hashes(fields: dict[bytes, bytes]) -> list[int]:
    batch = decode_entry(fields, events_pb2.KVEventBatch)
    return [
        h
        for e in batch.events
        if e.kind == events_pb2.KVEvent.KIND_BLOCK_STORED
        for h in e.block_hashes
    ]


async def test_restart_drops_stale_blocks_before_the_engine_answers(
    vllm_small: VLLMServer, redis_url: str, real_model: Path
) -> None:
    """Bound: the index forgets the instance's blocks once the bridge sees the restarted
    engine's publisher, which vLLM binds before its API server answers; so by the time the
    engine is ready again, the gateway predicts no cached tokens on it."""
    async with front([vllm_small], redis_url, real_model) as f:
        body = prompt(60)
        await post(vllm_small.url, body)
        hashes = f.hashes(body)
        await wait_held(f, vllm_small, hashes, len(hashes))
        (bridge,) = f.bridges.values()
        await asyncio.to_thread(vllm_small.restart)  # returns once /v1/models answers again
        held_when_ready = f.held(vllm_small, hashes)
        restarts = bridge.core.stats.restarts
        again = await post(vllm_small.url, body)
    assert (held_when_ready, restarts) == (0, 1)
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
