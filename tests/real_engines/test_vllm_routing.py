"""Precise routing in front of two real vLLM instances: their own KV events, through the
kv-bridge, tell kvmeta (and the gateway's local replica) where a session's blocks are, and the
next turn goes there with the cached tokens the gateway predicted equal to vLLM's.

The first turn is sent to one instance directly, past the gateway, and without a session
header: only the engine's events can tell the gateway where its blocks are."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import aiohttp
import pytest

from services.scheduler.keys.model import tenant_salt
from tests.helpers.keys import FakeKeyStore, fake_gate
from tests.helpers.vllm import MODEL_NAME, VLLMServer
from tests.helpers.waits import eventually
from tests.real_engines._front import Front, front, instance_id

WORDS = "the quick brown fox jumps over the lazy dog while agents read code and call tools".split()


def document(seed: int, words: int = 200) -> str:
    """A long distinct system prompt (several 128-token blocks)."""
    return " ".join(WORDS[(i * 7 + seed) % len(WORDS)] + str((i * seed) % 97) for i in range(words))


def turn(seed: int, n: int) -> dict[str, Any]:
    """Turn ``n`` (1, 2) of a session: each extends the previous one's messages."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": document(seed)},
        {"role": "user", "content": "summarise the document"},
    ]
    if n > 1:
        messages += [
            {"role": "assistant", "content": "it is about a fox and some agents"},
            {"role": "user", "content": "and what do the agents do?"},
        ]
    return {"model": MODEL_NAME, "messages": messages, "max_tokens": 2}


async def post(
    url: str, body: dict[str, Any], headers: dict[str, str] | None = None
) -> dict[str, Any]:
    async with (
        aiohttp.ClientSession() as http,
        http.post(url + "/v1/chat/completions", json=body, headers=headers or {}) as r,
    ):
        answer = await r.json(content_type=None)
        assert r.status == 200, answer
        return dict(answer)


async def held_everywhere(f: Front, server: VLLMServer, hashes: list[int]) -> None:
    """Until kvmeta's index, and the gateway's replica when it has one, hold ``hashes``."""

    async def indexed() -> bool:
        return f.held(server, hashes) == len(hashes)

    await eventually(indexed, within_s=30)


@pytest.mark.parametrize("source", ["kvmeta", "local"])
@pytest.mark.parametrize("target", [0, 1], ids=["first", "second"])
async def test_next_turn_goes_where_vllm_holds_the_session(
    vllm_pair: tuple[VLLMServer, VLLMServer],
    redis_url: str,
    real_model: Path,
    source: Literal["kvmeta", "local"],
    target: int,
) -> None:
    holder = vllm_pair[target]
    seed = 11 + target + (2 if source == "local" else 0)
    async with front(list(vllm_pair), redis_url, real_model, precise_source=source) as f:
        first = turn(seed, 1)
        await post(holder.url, first)  # past the gateway
        hashes = f.hashes(first)
        assert len(hashes) >= 4
        await held_everywhere(f, holder, hashes)  # vLLM's BlockStored hashes = the gateway's
        if source == "local":
            replica = f.scheduler.integrations.kv_feed
            assert replica is not None

            async def replicated() -> bool:
                got = replica.replica.match(hashes, "", "")
                held = got.get(instance_id(holder))
                return held is not None and held.matched_blocks == len(hashes)

            await eventually(replicated, within_s=30)
        answer = await post(f.url, turn(seed, 2))
        (record,) = await f.records(1)
    cached = answer["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert record.decode_instance == instance_id(holder)
    assert cached >= len(hashes) * 128
    assert record.predicted_cached_tokens == record.cached_tokens == cached


async def test_tenants_from_api_keys_hit_only_their_own_blocks(
    vllm_pair: tuple[VLLMServer, VLLMServer], redis_url: str, real_model: Path
) -> None:
    """A keyed request's namespace reaches vLLM as ``cache_salt``: the gateway's salted hashes
    equal vLLM's, the tenant's next turn is routed to its blocks with the cached tokens
    predicted exactly, and another tenant with the same prompt is predicted, and gets, none."""
    store = FakeKeyStore()
    acme, globex = store.add("acme"), store.add("globex")
    holder = vllm_pair[1]
    first = turn(21, 1)
    salt = tenant_salt("acme", "")
    async with front(list(vllm_pair), redis_url, real_model, keys=fake_gate(store)) as f:
        await post(holder.url, {**first, "cache_salt": salt})  # past the gateway
        hashes = f.hashes(first, cache_salt=salt)
        assert hashes[0] != f.hashes(first)[0]
        await held_everywhere(f, holder, hashes)
        mine = await post(f.url, turn(21, 2), {"Authorization": f"Bearer {acme}"})
        theirs = await post(f.url, turn(21, 2), {"Authorization": f"Bearer {globex}"})
        records = await f.records(2)
    by_tenant = {r.tenant: r for r in records}
    assert by_tenant["acme"].decode_instance == instance_id(holder)
    cached = mine["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= len(hashes) * 128
    assert by_tenant["acme"].predicted_cached_tokens == by_tenant["acme"].cached_tokens == cached
    assert theirs["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert by_tenant["globex"].predicted_cached_tokens == by_tenant["globex"].cached_tokens == 0


async def test_back_to_back_turns_predict_vllms_cached_tokens(
    vllm_pair: tuple[VLLMServer, VLLMServer], redis_url: str, real_model: Path
) -> None:
    """An agent's next turn arrives the moment its previous one ends, before the engine's
    events of the previous turn need have reached the index: the gateway's own record of
    what it routed still predicts the cached tokens to the block."""
    async with front(list(vllm_pair), redis_url, real_model) as f:
        for seed in (31, 32, 33):
            await post(f.url, turn(seed, 1))
            await post(f.url, turn(seed, 2))
        records = await f.records(6)
    in_order = sorted(records, key=lambda r: r.arrival_ms)
    for first, second in zip(in_order[0::2], in_order[1::2], strict=True):
        assert second.decode_instance == first.decode_instance
        assert second.cached_tokens >= (first.prompt_tokens // 128) * 128 > 0
        assert second.predicted_cached_tokens == second.cached_tokens, (first, second)
