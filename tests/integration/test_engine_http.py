"""The engine simulator's HTTP API, in process (aiohttp test server on a free port)."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from services.common.tokens import block_hashes, render_token, tokenize
from tests.helpers.engines import EngineFactory, EngineFleet, sse
from tests.helpers.waits import eventually

Factory = EngineFactory

LONG = " ".join(f"w{i}" for i in range(300))  # 300 tokens: 4 full 64-token blocks


@pytest.fixture
async def make_engine(tmp_path: Path) -> AsyncIterator[Factory]:
    fleet = EngineFleet(tmp_path, profile="test", speedup=20.0)
    yield fleet.start
    await fleet.close()


@pytest.mark.parametrize(
    ("path", "key"),
    [
        ("/health", None),
        ("/health_generate", None),
        ("/server_info", "model_path"),
        ("/get_server_info", "model_path"),
        ("/model_info", "model_path"),
        ("/get_model_info", "is_generation"),
        ("/v1/models", "data"),
    ],
    ids=[
        "health",
        "health_generate",
        "server_info",
        "get_server_info",
        "model_info",
        "get_model_info",
        "models",
    ],
)
async def test_info_endpoints_answer(
    make_engine: Factory, http: aiohttp.ClientSession, path: str, key: str | None
) -> None:
    _, url = await make_engine()
    async with http.get(url + path) as resp:
        assert resp.status == 200
        if key is not None:
            body = await resp.json()
            assert key in body
            if key == "model_path":
                assert (Path(body["model_path"]) / "config.json").is_file()


@pytest.mark.parametrize("kind", ["chat", "completion", "generate"])
async def test_repeated_prompt_reports_cached_tokens(
    make_engine: Factory, http: aiohttp.ClientSession, kind: str
) -> None:
    _, url = await make_engine()
    if kind == "chat":
        path, body = (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": LONG}], "max_tokens": 3},
        )
    elif kind == "completion":
        path, body = "/v1/completions", {"prompt": LONG, "max_tokens": 3}
    else:
        path, body = "/generate", {"text": LONG, "sampling_params": {"max_new_tokens": 3}}
    cached = []
    for _ in range(2):
        async with http.post(url + path, json=body) as resp:
            assert resp.status == 200
            out = await resp.json()
        if kind == "generate":
            assert out["meta_info"]["completion_tokens"] == 3
            cached.append(out["meta_info"]["cached_tokens"])
        else:
            assert out["usage"]["completion_tokens"] == 3
            cached.append(out["usage"]["prompt_tokens_details"]["cached_tokens"])
    assert cached == [0, 256]


async def test_streamed_chat_coalesces_tokens_and_always_reports_usage(
    make_engine: Factory, http: aiohttp.ClientSession
) -> None:
    _, url = await make_engine(stream_interval=4)
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 10, "stream": True}
    async with http.post(url + "/v1/chat/completions", json=body) as resp:
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        events = await sse(resp)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    sizes = [len(c["choices"][0]["delta"]["content"].split()) for c in chunks]
    assert sizes == [4, 4, 2]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["usage"]["completion_tokens"] == 10


async def test_include_usage_adds_a_usage_only_chunk(
    make_engine: Factory, http: aiohttp.ClientSession
) -> None:
    _, url = await make_engine()
    body = {
        "prompt": "a b c",
        "max_tokens": 2,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with http.post(url + "/v1/completions", json=body) as resp:
        events = await sse(resp)
    assert events[-1] == "[DONE]"
    assert events[-2]["choices"] == [] and events[-2]["usage"]["prompt_tokens"] == 3


async def test_generate_streams_cumulative_text_with_meta_info(
    make_engine: Factory, http: aiohttp.ClientSession
) -> None:
    _, url = await make_engine()
    body = {"input_ids": [300, 301, 302], "sampling_params": {"max_new_tokens": 3}, "stream": True}
    async with http.post(url + "/generate", json=body) as resp:
        events = await sse(resp)
    assert events[-1] == "[DONE]"
    last = events[-2]
    assert len(last["output_ids"]) == 3 and len(last["text"].split()) == 3
    assert last["meta_info"]["prompt_tokens"] == 3
    assert last["text"].split() == [render_token(t) for t in last["output_ids"]]


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics")


async def test_metrics_move_with_load(make_engine: Factory, http: aiohttp.ClientSession) -> None:
    _, url = await make_engine()
    async with http.post(url + "/fault", json={"stall_s": 30}) as resp:
        assert resp.status == 200
    body = {"prompt": LONG, "max_tokens": 5}
    pending = asyncio.create_task(http.post(url + "/v1/completions", json=body))
    await eventually(lambda: _gauges(http, url, (0.0, 1.0)))
    async with http.get(url + "/metrics") as resp:
        text = await resp.text()
    assert _metric(text, "sglang:generation_tokens_total") == 0.0
    async with http.post(url + "/fault", json={"stall_s": 0}) as resp:
        assert resp.status == 200
    async with await pending as resp:
        assert resp.status == 200
    async with http.get(url + "/metrics") as resp:
        text = await resp.text()
    assert _metric(text, "sglang:num_queue_reqs") == 0.0
    assert _metric(text, "sglang:prompt_tokens_total") == 300.0
    assert _metric(text, "sglang:generation_tokens_total") == 5.0
    assert _metric(text, "sglang:time_to_first_token_seconds_count") == 1.0


@pytest.mark.parametrize("role", ["aggregated", "prefill"])
async def test_requests_in_the_step_in_progress_count_as_running(
    tmp_path: Path, http: aiohttp.ClientSession, role: str
) -> None:
    """Requests that arrived together go into one step. Until it ends they are running,
    also on a prefill engine, where that step is their last (the core let go of them when
    it planned it)."""
    fleet = EngineFleet(tmp_path, profile="test", speedup=0.0005, role=role)
    engine, url = await fleet.start()
    body = {"prompt": LONG, "max_tokens": 5}
    pending: list[asyncio.Task[aiohttp.ClientResponse]] = []
    try:
        async with http.post(url + "/fault", json={"stall_s": 60}) as resp:
            assert resp.status == 200
        pending += [
            asyncio.create_task(http.post(url + "/v1/completions", json=body)) for _ in range(3)
        ]
        await eventually(lambda: _gauges(http, url, (0.0, 3.0)), within_s=30)
        async with http.post(url + "/fault", json={"stall_s": 0}) as resp:
            assert resp.status == 200
        # one step takes all three (900 tokens, within the step's budget) and does not end
        await eventually(lambda: _gauges(http, url, (3.0, 0.0)), within_s=30)
        assert not any(t.done() for t in pending)
        assert engine.figures().num_running == 3
    finally:
        for t in pending:
            t.cancel()
        await fleet.close()


@pytest.mark.parametrize("kind", ["chat", "completion"])
async def test_steps_follow_each_other_on_the_modelled_clock(
    tmp_path: Path, http: aiohttp.ClientSession, kind: str
) -> None:
    """One request decoding alone: each step starts exactly where the previous one was
    planned to end, whatever the shell spent between them (services.engine.pacing; the
    catch-up window is wide so that a slow test machine cannot break the schedule). Read
    from the engine's step trace, which also records the shell's lateness."""
    trace = tmp_path / "steps.jsonl"
    fleet = EngineFleet(tmp_path, profile="test", speedup=20.0, catch_up_ms=600_000.0,
                        step_trace=trace)  # fmt: skip
    _, url = await fleet.start()
    try:
        path, body = (
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": LONG}]})
            if kind == "chat"
            else ("/v1/completions", {"prompt": LONG})
        )
        async with http.post(url + path, json={**body, "max_tokens": 40}) as resp:
            assert resp.status == 200
            await resp.read()
    finally:
        await fleet.close()  # closes the trace
    events = [json.loads(line) for line in trace.read_text(encoding="utf-8").splitlines()]
    steps = [e for e in events if e["ev"] == "step"]
    assert [e["ev"] for e in events if e["ev"] != "step"] == ["submit", "first", "done"]
    assert len(steps) == 40  # the prefill (first token), then 39 decodes
    for prev, nxt in itertools.pairwise(steps):
        assert nxt["t"] == pytest.approx(prev["t"] + prev["d"], abs=0.002)
        assert nxt["late"] >= 0.0
    done = next(e for e in events if e["ev"] == "done")
    assert done["tokens"] == 40
    assert done["t"] == pytest.approx(steps[-1]["t"] + steps[-1]["d"], abs=0.002)


async def _gauges(http: aiohttp.ClientSession, url: str, want: tuple[float, float]) -> bool:
    async with http.get(url + "/metrics") as resp:
        text = await resp.text()
    got = (_metric(text, "sglang:num_running_reqs"), _metric(text, "sglang:num_queue_reqs"))
    return got == want


async def test_vllm_dialect_uses_vllm_names(
    make_engine: Factory, http: aiohttp.ClientSession
) -> None:
    _, url = await make_engine(metrics_dialect="vllm")
    for _ in range(2):
        async with http.post(
            url + "/v1/completions", json={"prompt": LONG, "max_tokens": 1}
        ) as resp:
            assert resp.status == 200
    async with http.get(url + "/metrics") as resp:
        text = await resp.text()
    assert "sglang:" not in text
    assert _metric(text, "vllm:num_requests_running") == 0.0
    assert _metric(text, "vllm:prefix_cache_queries_total") == 600.0
    assert _metric(text, "vllm:prefix_cache_hits_total") == 256.0
    for name in (
        "vllm:num_requests_waiting",
        "vllm:gpu_cache_usage_perc",
        "vllm:kv_cache_usage_perc",
    ):
        _metric(text, name)


@pytest.mark.parametrize(
    ("path", "raw", "param"),
    [
        ("/v1/completions", b"{not json", None),
        ("/v1/completions", b'["a list"]', None),
        ("/v1/completions", json.dumps({"prompt": "a", "max_tokens": "5"}).encode(), "max_tokens"),
        ("/v1/completions", json.dumps({"prompt": "a", "max_tokens": 0}).encode(), "max_tokens"),
        ("/v1/completions", json.dumps({"prompt": 5}).encode(), "prompt"),
        (
            "/v1/completions",
            json.dumps({"prompt": "a", "temperature": "hot"}).encode(),
            "temperature",
        ),
        (
            "/v1/completions",
            json.dumps({"prompt": "a " * 40_000, "max_tokens": 5}).encode(),
            "prompt",
        ),
        ("/v1/chat/completions", json.dumps({"messages": "hi"}).encode(), "messages"),
        (
            "/v1/chat/completions",
            json.dumps({"messages": [{"role": "user", "content": "x"}], "max_tokens": -1}).encode(),
            "max_tokens",
        ),
        (
            "/v1/chat/completions",
            json.dumps({"messages": [{"role": "user", "content": "x"}], "stream": "yes"}).encode(),
            "stream",
        ),
        ("/generate", json.dumps({"sampling_params": {"max_new_tokens": 2}}).encode(), "text"),
        ("/generate", json.dumps({"input_ids": [1, "b"]}).encode(), "input_ids"),
    ],
    ids=[
        "malformed-json",
        "not-an-object",
        "max-tokens-string",
        "max-tokens-zero",
        "prompt-int",
        "temperature-string",
        "over-context",
        "messages-string",
        "chat-negative-max",
        "stream-string",
        "generate-no-text",
        "generate-bad-ids",
    ],
)
async def test_bad_input_is_400_and_engine_keeps_serving(
    make_engine: Factory, http: aiohttp.ClientSession, path: str, raw: bytes, param: str | None
) -> None:
    _, url = await make_engine()
    async with http.post(
        url + path, data=raw, headers={"Content-Type": "application/json"}
    ) as resp:
        assert resp.status == 400
        err = (await resp.json())["error"]
    assert err["type"] == "invalid_request_error" and err["message"] and err["param"] == param
    async with http.post(url + "/v1/completions", json={"prompt": "a", "max_tokens": 1}) as resp:
        assert resp.status == 200


async def test_fault_knobs(make_engine: Factory, http: aiohttp.ClientSession) -> None:
    _, url = await make_engine()
    async with http.post(url + "/fault", json={"refuse_health": True, "fail_rate": 1.0}) as resp:
        assert (await resp.json())["refuse_health"] is True
    async with http.get(url + "/health") as resp:
        assert resp.status == 503
    async with http.post(url + "/v1/completions", json={"prompt": "a", "max_tokens": 1}) as resp:
        assert resp.status == 500 and (await resp.json())["error"]["code"] == "fault"
    async with http.post(
        url + "/fault", json={"refuse_health": False, "fail_rate": 0, "die_after_tokens": 3}
    ):
        pass
    body = {"prompt": "a", "max_tokens": 10, "stream": True}
    seen: list[Any] = []
    with pytest.raises(aiohttp.ClientPayloadError):
        async with http.post(url + "/v1/completions", json=body) as resp:
            seen = await sse(resp)
    assert "[DONE]" not in seen
    async with http.post(url + "/fault", json={"die_after_tokens": 0}):
        pass
    async with http.post(url + "/v1/completions", json={"prompt": "a", "max_tokens": 2}) as resp:
        assert resp.status == 200


async def test_prefill_decode_handshake(make_engine: Factory, http: aiohttp.ClientSession) -> None:
    prefill, purl = await make_engine(role="prefill")
    decode, durl = await make_engine(role="decode")
    port = int(purl.rsplit(":", 1)[1])
    body = {
        "messages": [{"role": "user", "content": LONG}],
        "max_tokens": 6,
        "bootstrap_host": "127.0.0.1",
        "bootstrap_port": port,
        "bootstrap_room": 424242,
    }

    async def call(url: str) -> dict[str, Any]:
        async with http.post(url + "/v1/chat/completions", json=body) as resp:
            assert resp.status == 200, await resp.text()
            out: dict[str, Any] = await resp.json()
            return out

    d_task = asyncio.create_task(call(durl))  # the decode side may arrive first
    await asyncio.sleep(0.05)
    p_out, d_out = await asyncio.gather(call(purl), d_task)
    assert p_out["usage"]["completion_tokens"] == 1
    assert d_out["usage"]["completion_tokens"] == 6
    assert decode.core.prompt_tokens_total == 0  # the decode side computed no prompt
    assert prefill.core.prompt_tokens_total == len(tokenize("user: " + LONG))
    for _ in range(500):  # the prefill frees its KV once the modelled transfer is over
        if prefill.core.num_held == 0:
            break
        await asyncio.sleep(0.01)
    assert prefill.core.num_held == 0 and prefill.core.cache.usage == 0.0
    assert decode.core.cache.usage == 0.0


async def _has_entries(redis_client: Any, stream: str) -> bool:
    return bool(await redis_client.xlen(stream))


async def test_kv_events_and_load_snapshots_reach_redis(
    make_engine: Factory, http: aiohttp.ClientSession, redis_client: Any
) -> None:
    from tideserve.v1 import events_pb2

    engine, url = await make_engine(
        redis=redis_client, deployment="evt", kv_flush_ms=10.0, load_interval_ms=10.0, kv_blocks=8
    )
    async with http.post(url + "/v1/completions", json={"prompt": LONG, "max_tokens": 1}) as resp:
        assert resp.status == 200
    other = " ".join(f"z{i}" for i in range(300))  # forces eviction of the first prompt
    async with http.post(url + "/v1/completions", json={"prompt": other, "max_tokens": 1}) as resp:
        assert resp.status == 200
    async with http.post(url + "/flush_cache") as resp:
        assert resp.status == 200
    events: list[Any] = []
    for _ in range(300):
        entries = await redis_client.xrange("ts:kv:evt")
        batches = [events_pb2.KVEventBatch.FromString(f[b"p"]) for _, f in entries]
        events = [e for b in batches for e in b.events]
        if events and events[-1].kind == events_pb2.KVEvent.KIND_ALL_CLEARED:
            break
        await asyncio.sleep(0.02)
    assert [b.seq for b in batches] == list(range(1, len(batches) + 1))
    assert {b.instance_id for b in batches} == {engine.instance_id}
    assert all(b.epoch == engine.epoch and b.block_size == 64 for b in batches)
    assert entries[0][1][b"t"] == b"tideserve.v1.KVEventBatch"
    stored = [
        h for e in events if e.kind == events_pb2.KVEvent.KIND_BLOCK_STORED for h in e.block_hashes
    ]
    removed = [
        h for e in events if e.kind == events_pb2.KVEvent.KIND_BLOCK_REMOVED for h in e.block_hashes
    ]
    first, second = block_hashes(tokenize(LONG), 64), block_hashes(tokenize(other), 64)
    assert stored == first + second
    assert set(removed) <= set(first) and removed
    assert events[-1].kind == events_pb2.KVEvent.KIND_ALL_CLEARED
    # the load publisher runs on its own 10 ms timer: wait for its first snapshot
    await eventually(lambda: _has_entries(redis_client, "ts:load:evt"))
    snaps = await redis_client.xrange("ts:load:evt")
    snap = events_pb2.LoadSnapshot.FromString(snaps[-1][1][b"p"])
    assert snap.instance_id == engine.instance_id and snap.kv_capacity_blocks == 8
