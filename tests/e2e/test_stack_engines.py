"""`tideserve up` with simulated engines behind the gateway, as real processes (issue 5).

Each stack runs on Postgres/Redis from the session fixtures (no embedded servers per stack),
the four services and the engines on ephemeral ports that were free a moment ago (written into
a config file, never a design default), the small 'test' performance profile and a small KV
cache. Requests go through the scheduler's OpenAI-compatible gateway only.

- aggregated (2 engines): streamed and non-streamed chat, cached tokens on a repeated long
  prompt, /v1/models, `status` lists the engines;
- P/D (1 prefill + 1 decode): streamed completions through the SGLang bootstrap hand-off
  (the prefill engine really computed the prompt); the stack starts them with the data plane
  (kvmeta's metadata endpoint, open to the token-less Transfer Engine in the secured stack),
  so the decode pulls the prompt's KV bytes: ``kv_pulls_total{outcome="ok"}`` counts them and
  the request records carry ``kv_transfer_ms > 0``.

An engine SIGKILLed mid-run: `test_stack_engine_kill.py`. The stack builders:
`tests/helpers/engine_stack.py`.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator

import aiohttp
import pytest

from tests.helpers.engine_stack import (
    REQUEST_TIMEOUT_S,
    SERVICES,
    EngineStack,
    metric_total,
    metric_total_with,
    request_records,
    start_engine_stack,
    stream_sse,
    words,
)
from tests.helpers.stack import status_json

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def aggregated(postgres_url: str, redis_url: str) -> Iterator[EngineStack]:
    with start_engine_stack(
        postgres_url, redis_url, 2, ["--engines", "2", "--engine-speedup", "20"]
    ) as stack:
        yield stack


async def test_aggregated_chat_streamed_non_streamed_models_and_cache(
    aggregated: EngineStack, redis_url: str
) -> None:
    assert {n: e.role for n, e in aggregated.engines.items()} == {
        "engine-1": "aggregated",
        "engine-2": "aggregated",
    }
    base = aggregated.gateway
    async with aiohttp.ClientSession() as s:
        async with s.get(base + "/v1/models", timeout=aiohttp.ClientTimeout(total=30)) as r:
            assert r.status == 200
            models = [m["id"] for m in (await r.json())["data"]]
        assert models == ["tideserve-sim"]
        msg = {"model": models[0], "messages": [{"role": "user", "content": "hello there"}]}

        async with s.post(
            base + "/v1/chat/completions",
            json={**msg, "max_tokens": 8},
            timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S),
        ) as r:
            assert r.status == 200, await r.text()
            body = await r.json()
        assert body["object"] == "chat.completion"
        assert body["choices"][0]["message"]["content"]
        assert 0 < body["usage"]["completion_tokens"] <= 8

        streamed = await stream_sse(
            s,
            base + "/v1/chat/completions",
            {**msg, "max_tokens": 12, "stream_options": {"include_usage": True}},
        )
        assert streamed.status == 200
        assert streamed.error is None and not streamed.malformed and streamed.done
        assert streamed.chunks > 1 and streamed.text
        assert streamed.usage is not None and 0 < streamed.usage["completion_tokens"] <= 12

        # A long prompt twice: the second lands where the first left its KV blocks.
        long_msg = {
            "model": models[0],
            "messages": [{"role": "user", "content": words(600, uuid.uuid4().hex[:6])}],
            "max_tokens": 4,
        }
        cached = []
        for _ in range(2):
            async with s.post(
                base + "/v1/chat/completions",
                json=long_msg,
                timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S),
            ) as r:
                assert r.status == 200, await r.text()
                usage = (await r.json())["usage"]
            cached.append(usage.get("prompt_tokens_details", {}).get("cached_tokens", 0))
        assert cached[0] == 0
        assert cached[1] >= 512, cached  # most of the 600-word prompt, in whole 64-token blocks

        # The stack points the gateway at its kvmeta: once kvmeta has indexed the engines'
        # KV events, the gateway's precise-prefix lookups are answered.
        ok = 0.0
        deadline = time.monotonic() + 20
        while ok == 0 and time.monotonic() < deadline:
            async with s.post(
                base + "/v1/chat/completions",
                json=long_msg,
                timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S),
            ) as r:
                assert r.status == 200, await r.text()
            async with s.get(base + "/metrics", timeout=aiohttp.ClientTimeout(total=30)) as r:
                ok = metric_total_with(
                    await r.text(), "tideserve_gateway_kvmeta_lookups_total", 'result="ok"'
                )
            if ok == 0:
                await asyncio.sleep(0.5)
        assert ok > 0, "the gateway never got a MatchPrefix answer from the stack's kvmeta"

    # the engines publish to the stack's Redis, under the scheduler's deployment
    import redis.asyncio as aioredis

    rc = aioredis.Redis.from_url(redis_url)
    streams = [f"ts:kv:{aggregated.deployment}", f"ts:load:{aggregated.deployment}"]
    try:
        lengths = [0, 0]
        deadline = time.monotonic() + 20  # events are flushed in the background
        while 0 in lengths and time.monotonic() < deadline:
            lengths = [await rc.xlen(name) for name in streams]
            await asyncio.sleep(0.1)
    finally:
        await rc.aclose()
    assert 0 not in lengths, dict(zip(streams, lengths, strict=True))

    code, report = await asyncio.to_thread(status_json, aggregated.state_dir)
    assert code == 0, report
    assert report["gateway_url"] == base + "/v1"
    assert {e["name"]: (e["role"], e["health"], e["alive"]) for e in report["engines"]} == {
        "engine-1": ("aggregated", "SERVING", True),
        "engine-2": ("aggregated", "SERVING", True),
    }
    assert {s["name"] for s in report["services"]} == set(SERVICES)


async def test_pd_streamed_completions_through_bootstrap(postgres_url: str, redis_url: str) -> None:
    with start_engine_stack(
        postgres_url,
        redis_url,
        2,
        ["--prefill", "1", "--decode", "1", "--engine-speedup", "20"],
    ) as stack:
        assert {n: e.role for n, e in stack.engines.items()} == {
            "prefill-1": "prefill",
            "decode-1": "decode",
        }
        prefill_url = stack.engines["prefill-1"].url
        decode_url = stack.engines["decode-1"].url
        async with aiohttp.ClientSession() as s:
            # long enough (> the P/D decider's 512 uncached tokens) to be disaggregated
            prompts = [words(800, f"{uuid.uuid4().hex[:6]}") for _ in range(3)]
            chat = {"messages": [{"role": "user", "content": prompts[0]}]}
            outcomes = [
                await stream_sse(
                    s,
                    stack.gateway + "/v1/chat/completions",
                    {"model": "tideserve-sim", "max_tokens": 16, **chat},
                )
            ]
            outcomes += await asyncio.gather(
                *(
                    stream_sse(
                        s,
                        stack.gateway + "/v1/completions",
                        {"model": "tideserve-sim", "prompt": p, "max_tokens": 16},
                    )
                    for p in prompts[1:]
                )
            )
            for o in outcomes:
                assert o.status == 200, o.body
                assert o.error is None and not o.malformed and o.done, o
                assert o.chunks > 1
            metrics = {}
            for name, url in (("prefill", prefill_url), ("decode", decode_url)):
                async with s.get(f"{url}/metrics") as r:
                    metrics[name] = await r.text()
        # SGLang-style P/D (the stack's default pd_protocol): a decode engine never computes a
        # prompt alone, so the prefill engine computed all three prompts (800 words each) and
        # the decode engine generated the tokens.
        assert metric_total(metrics["prefill"], "sglang:prompt_tokens_total") >= 3 * 800
        assert metric_total(metrics["decode"], "sglang:generation_tokens_total") >= 3 * 2
        # the data plane: the decode pulled each prompt's blocks over the Transfer Engine
        pulled = metric_total_with(metrics["decode"], "tideserve:kv_pulls_total", '"ok"')
        assert pulled >= 3, metrics["decode"]
        assert metric_total(metrics["decode"], "tideserve:kv_pull_bytes_total") > 0
        records = await request_records(redis_url, stack.deployment, 3)
        assert len(records) >= 3, records
        assert all(r.kv_transfer_ms > 0 and r.kv_transfer_bytes > 0 for r in records), records
        assert not any(r.kv_transfer_failed for r in records)
