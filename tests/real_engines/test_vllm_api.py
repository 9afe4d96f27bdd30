"""The OpenAI API through the gateway to real vLLM: answers, streaming with usage, tool calls
passed through, vLLM's own errors in the OpenAI shape, and token counts equal to vLLM's."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from services.scheduler.http.openai import parse_request
from tests.helpers.vllm import MODEL_NAME, VLLMServer
from tests.helpers.waits import eventually
from tests.real_engines._front import Front, front

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "the weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}


@pytest.fixture
async def gw(
    vllm_pair: tuple[VLLMServer, VLLMServer], redis_url: str, real_model: Path
) -> AsyncIterator[Front]:
    async with front(list(vllm_pair), redis_url, real_model) as f:
        yield f


async def post(url: str, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as http, http.post(url + path, json=body) as r:
        return r.status, await r.json(content_type=None)


async def test_chat_and_completion(gw: Front) -> None:
    chat = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hello"}]}
    status, body = await post(gw.url, "/v1/chat/completions", {**chat, "max_tokens": 4})
    assert status == 200, body
    assert body["object"] == "chat.completion"
    assert body["usage"]["completion_tokens"] == 4
    assert isinstance(body["choices"][0]["message"]["content"], str)
    comp = {"model": MODEL_NAME, "prompt": "the quick brown fox", "max_tokens": 3}
    status, body = await post(gw.url, "/v1/completions", comp)
    assert status == 200, body
    assert body["object"] == "text_completion" and body["usage"]["completion_tokens"] == 3


async def test_streamed_chat_with_usage(gw: Front) -> None:
    body = {
        "model": MODEL_NAME,
        "messages": [{"role": "user", "content": "tell me about caches"}],
        "max_tokens": 6,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    chunks: list[dict[str, Any]] = []
    async with (
        aiohttp.ClientSession() as http,
        http.post(gw.url + "/v1/chat/completions", json=body) as r,
    ):
        assert r.status == 200 and r.content_type == "text/event-stream"
        done = False
        async for raw in r.content:
            line = raw.decode().strip()
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                chunks.append(json.loads(line[6:]))
    assert done
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[-1]["usage"]["completion_tokens"] == 6
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert any("content" in d for d in deltas)


def _without_ids(choices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Choices with the tool calls' ids dropped (vLLM draws a fresh one per answer)."""
    out = json.loads(json.dumps(choices))
    for c in out:
        for call in c["message"].get("tool_calls") or []:
            call.pop("id", None)
    return out


async def test_tool_calls_pass_through(gw: Front, vllm_pair: tuple[VLLMServer, VLLMServer]) -> None:
    """``tools`` and ``tool_choice`` reach vLLM and its answer comes back unchanged: at
    temperature 0 the gateway's answer equals vLLM's own to the same request (its tool calls,
    as vLLM's hermes parser found them, or its text when the random model wrote no valid call;
    vLLM's CPU build does not always enforce the tool grammar), and a following turn with the
    tool's result is accepted."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "weather in Paris?"}]
    req = {
        "model": MODEL_NAME,
        "messages": messages,
        "tools": [WEATHER_TOOL],
        "tool_choice": "required",
        "max_tokens": 60,
        "temperature": 0,
    }
    status, direct = await post(vllm_pair[0].url, "/v1/chat/completions", req)
    assert status == 200, direct
    status, via = await post(gw.url, "/v1/chat/completions", req)
    assert status == 200, via
    assert _without_ids(via["choices"]) == _without_ids(direct["choices"])
    assert via["usage"]["prompt_tokens"] == direct["usage"]["prompt_tokens"]
    call = {
        "id": "call-1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }
    messages += [
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call-1", "content": "sunny, 21 C"},
    ]
    status, body = await post(
        gw.url,
        "/v1/chat/completions",
        {"model": MODEL_NAME, "messages": messages, "tools": [WEATHER_TOOL], "max_tokens": 3},
    )
    assert status == 200, body
    assert body["usage"]["completion_tokens"] >= 1


async def test_over_long_prompt_gets_vllms_error_as_openai_error(gw: Front) -> None:
    prompt = " ".join(["hello"] * 3000)  # past --max-model-len 2048
    status, body = await post(
        gw.url, "/v1/completions", {"model": MODEL_NAME, "prompt": prompt, "max_tokens": 2}
    )
    assert status == 400, body
    err = body["error"]
    assert set(err) >= {"message", "type", "code"}
    assert "2048" in err["message"], err  # vLLM's own explanation, passed on


CONVERSATIONS: list[tuple[str, dict[str, Any]]] = [
    ("ascii", {"messages": [{"role": "user", "content": "hello there, how are you?"}]}),
    (
        "multi-turn",
        {
            "messages": [
                {"role": "system", "content": "be brief and precise"},
                {"role": "user", "content": "what is a prefix cache?"},
                {"role": "assistant", "content": "a cache of prompt prefixes"},
                {"role": "user", "content": "and a block?"},
            ]
        },
    ),
    ("unicode", {"messages": [{"role": "user", "content": "héllo wörld, ça va? 東京 🚀"}]}),
    (
        "text-parts",
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "routing requests"},
                        {"type": "text", "text": "saves prefill time"},
                    ],
                }
            ]
        },
    ),
    ("whitespace", {"messages": [{"role": "user", "content": "  spaced \n\n out\t text  "}]}),
    (
        "tools",
        {
            "messages": [{"role": "user", "content": "weather?"}],
            "tools": [WEATHER_TOOL],
        },
    ),
    (
        "tool-result",
        {
            "messages": [
                {"role": "user", "content": "weather?"},
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {
                            "id": "call-1",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "call-1", "content": "rainy"},
            ],
            "tools": [WEATHER_TOOL],
        },
    ),
]


@pytest.mark.parametrize(
    "conversation", [c[1] for c in CONVERSATIONS], ids=[c[0] for c in CONVERSATIONS]
)
async def test_token_ids_equal_vllms(gw: Front, conversation: dict[str, Any]) -> None:
    """The gateway's prompt token ids equal vLLM's ``/tokenize`` of the same chat, and its
    count equals the usage vLLM reports for the request."""
    body = {"model": MODEL_NAME, **conversation}
    mine = parse_request(
        "chat",
        json.dumps(body).encode(),
        {},
        models=(),
        classes=[],
        tokens=gw.scheduler.gateway.opts.tokens,
    )
    server_url = gw.scheduler.core.fleet.spec(gw.scheduler.core.fleet.ids()[0]).url
    status, tok = await post(server_url, "/tokenize", body)
    assert status == 200, tok
    assert list(mine.prompt_ids) == tok["tokens"]
    status, answer = await post(gw.url, "/v1/chat/completions", {**body, "max_tokens": 1})
    assert status == 200, answer
    assert answer["usage"]["prompt_tokens"] == len(mine.prompt_ids)


async def test_vllm_metrics_feed_the_gateways_load(gw: Front) -> None:
    """While a request decodes on vLLM, the gateway's view of that engine, scraped from
    its ``vllm:*`` metrics, shows it running and some KV in use."""
    fleet = gw.scheduler.core.fleet
    seen: list[tuple[str, int, float]] = []

    async def decoding() -> bool:
        now = gw.scheduler.gateway.clock()
        for iid in fleet.ids():
            view = fleet.view(iid, now)
            if view.running >= 1 and fleet.load_source(iid, now) == "scrape":
                seen.append((iid, view.running, view.kv_usage))
                return True
        return False

    body = {
        "model": MODEL_NAME,
        "prompt": "the quick brown fox " * 200,
        "max_tokens": 1500,
        "ignore_eos": True,
    }
    request = asyncio.create_task(post(gw.url, "/v1/completions", body))
    try:
        await eventually(decoding, within_s=60)
    finally:
        status, answer = await request
    assert status == 200, answer
    assert seen and seen[0][2] > 0.0, seen
