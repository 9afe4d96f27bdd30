"""The agent APIs in front of real vLLM, through the real client SDKs: Anthropic Messages
(``anthropic``) and OpenAI Responses (``openai``), each translated to chat completions and
forwarded natively to vLLM's own ``/v1/messages`` and ``/v1/responses`` (``native_apis``).

- a tool-use turn (an assistant tool call and its result) costs vLLM the same prompt tokens
  through either API, translated or native, as the equivalent chat request: the gateway's
  one canonical form is what vLLM renders, so its block hashes are vLLM's;
- ``count_tokens`` equals those prompt tokens;
- a session carried by an agent's own header only (Claude Code's, Codex's) comes back to
  the engine holding it, and its next turn hits vLLM's cache with the cached tokens the
  gateway predicted;
- streaming works through both SDKs;
- ``previous_response_id`` rebuilds the context from the gateway's store (Postgres), on
  another gateway replica than the one that answered the first turn, and vLLM sees the
  whole conversation; that replica retrieves and deletes the stored response;
- vLLM's own ``/v1/responses`` adds the tokenizer's BOS to the template's; the gateway's
  block hashes of a native Responses request do too, so they are the ones in vLLM's events.
"""

from __future__ import annotations

import copy
import json
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import anthropic
import openai
import pytest

from services.common import db
from services.common.apis.responses import chat_body, parse_responses
from services.common.tokens.engine_chat import adds_special_tokens
from services.scheduler.http.openai import parse_request
from tests.helpers.vllm import BLOCK_SIZE, MODEL_NAME, VLLMServer
from tests.helpers.waits import eventually
from tests.real_engines._front import Front, front, instance_id
from tests.real_engines.test_vllm_routing import document

pytestmark = pytest.mark.real_engine

MODES = pytest.mark.parametrize("native", [False, True], ids=["translated", "native"])
WEATHER_CHAT = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "the weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def chat_turn(seed: int) -> dict[str, Any]:
    """A tool-use turn as chat: system, user, the assistant's tool call, its result."""
    return {
        "model": MODEL_NAME,
        "max_tokens": 2,
        "tools": [WEATHER_CHAT],
        "messages": [
            {"role": "system", "content": document(seed)},
            {"role": "user", "content": "what is the weather in paris"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "paris"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "12 degrees and cloudy"},
        ],
    }


def messages_turn(seed: int) -> dict[str, Any]:
    """The same turn as an Anthropic Messages request."""
    return {
        "model": MODEL_NAME,
        "max_tokens": 2,
        "system": document(seed),
        "tools": [
            {
                "name": "get_weather",
                "description": "the weather in a city",
                "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
            }
        ],
        "messages": [
            {"role": "user", "content": "what is the weather in paris"},
            {
                "role": "assistant",
                "content": [
                    {
                        "type": "tool_use",
                        "id": "call_1",
                        "name": "get_weather",
                        "input": {"city": "paris"},
                    },
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "call_1",
                        "content": "12 degrees and cloudy",
                    },
                ],
            },
        ],
    }


def responses_turn(seed: int) -> dict[str, Any]:
    """The same turn as an OpenAI Responses request."""
    return {
        "model": MODEL_NAME,
        "max_output_tokens": 2,
        "instructions": document(seed),
        "tools": [
            {
                "type": "function",
                "name": "get_weather",
                "description": "the weather in a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            }
        ],
        "input": [
            {"role": "user", "content": "what is the weather in paris"},
            {
                "type": "function_call",
                "call_id": "call_1",
                "name": "get_weather",
                "arguments": '{"city": "paris"}',
            },
            {
                "type": "function_call_output",
                "call_id": "call_1",
                "output": "12 degrees and cloudy",
            },
        ],
        "store": False,
    }


def gateway_hashes(f: Front, body: dict[str, Any], native: bool) -> list[int]:
    """The block hashes the gateway computes for a Responses ``body`` (full blocks only)."""
    tokens = f.scheduler.gateway.opts.tokens
    special = adds_special_tokens(tokens.scheme, "responses", native)
    parsed = parse_request(
        "responses",
        json.dumps(body).encode(),
        {},
        models=(),
        classes=(),
        tokens=tokens,
        canonical=chat_body(parse_responses(body)),
        special_tokens=special,
    )
    return tokens.block_hashes(parsed.prompt_ids, BLOCK_SIZE)


async def chat_prompt_tokens(server: VLLMServer, body: dict[str, Any]) -> int:
    """vLLM's prompt tokens of a chat ``body`` (``/tokenize``: it caches nothing)."""
    ask = {"model": body["model"], "messages": body["messages"], "tools": body.get("tools")}
    async with (
        aiohttp.ClientSession() as http,
        http.post(server.url + "/tokenize", json=ask) as r,
    ):
        answer = await r.json()
        assert r.status == 200, answer
    return int(answer["count"])


@MODES
async def test_messages_through_the_sdk(
    vllm_pair: tuple[VLLMServer, VLLMServer], redis_url: str, real_model: Path, native: bool
) -> None:
    seed = 31 + native
    expected = await chat_prompt_tokens(vllm_pair[0], chat_turn(seed))
    apis = ["messages"] if native else []
    async with front(list(vllm_pair), redis_url, real_model, native_apis=apis) as f:
        client = anthropic.AsyncAnthropic(base_url=f.url, api_key="unused", max_retries=0)
        session = {"x-claude-code-session-id": f"cc-{uuid.uuid4().hex[:8]}"}
        body = messages_turn(seed)
        counted = await client.messages.count_tokens(
            **{k: v for k, v in body.items() if k != "max_tokens"}
        )
        first = await client.messages.create(**body, extra_headers=session)
        second_body = copy.deepcopy(body)
        second_body["messages"] += [
            {"role": "assistant", "content": "it is 12 degrees"},
            {"role": "user", "content": "and tomorrow?"},
        ]
        async with client.messages.stream(**second_body, extra_headers=session) as stream:
            second = await stream.get_final_message()
        await client.close()
        one, two = await f.records(2)

    assert counted.input_tokens == expected
    assert first.type == "message" and first.model == MODEL_NAME
    u = first.usage
    total = u.input_tokens + (u.cache_read_input_tokens or 0) + (u.cache_creation_input_tokens or 0)
    assert total == expected  # Anthropic's split of the prompt, as vLLM's own reports it
    assert second.stop_reason in ("max_tokens", "end_turn", "tool_use")
    assert (second.usage.cache_read_input_tokens or 0) >= 3 * 128
    assert (one.api, two.api) == ("messages", "messages")
    assert one.session_id == two.session_id == session["x-claude-code-session-id"]
    assert two.decode_instance == one.decode_instance
    assert two.predicted_cached_tokens == two.cached_tokens == second.usage.cache_read_input_tokens


@MODES
async def test_responses_through_the_sdk(
    vllm_pair: tuple[VLLMServer, VLLMServer],
    redis_url: str,
    real_model: Path,
    postgres_db_url: str,
    native: bool,
) -> None:
    seed = 41 + native
    expected = await chat_prompt_tokens(vllm_pair[0], chat_turn(seed))
    db.migrate(postgres_db_url, "scheduler")
    apis = ["responses"] if native else []
    async with front(
        list(vllm_pair),
        redis_url,
        real_model,
        native_apis=apis,
        postgres_url=postgres_db_url,
        replicas=2,
    ) as f:
        client, other = (
            openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
            for url in f.replica_urls
        )
        session = {"session-id": f"codex-{uuid.uuid4().hex[:8]}"}
        body = responses_turn(seed)
        first = await client.responses.create(**{**body, "store": True}, extra_headers=session)
        # vLLM's own events hold the blocks under the hashes the gateway computed
        (rec,) = await f.records(1)
        (holder,) = [s for s in vllm_pair if instance_id(s) == rec.decode_instance]
        hashes = gateway_hashes(f, body, native)

        async def indexed() -> bool:
            return f.held(holder, hashes) == len(hashes)

        await eventually(indexed, within_s=60)
        stream = await other.responses.create(
            model=MODEL_NAME,
            max_output_tokens=2,
            # not carried over (OpenAI's rule, vLLM's too): Codex sends them every turn
            instructions=body["instructions"],
            tools=body["tools"],
            previous_response_id=first.id,
            input=[{"role": "user", "content": "and tomorrow?"}],
            stream=True,
            extra_headers=session,
        )
        kinds = [event.type async for event in stream]
        one, two = await f.records(2)
        kept = await other.responses.retrieve(first.id)
        await other.responses.delete(first.id)
        with pytest.raises(openai.NotFoundError):
            await client.responses.retrieve(first.id)
        await client.close()
        await other.close()

    assert first.status in ("completed", "incomplete") and first.model == MODEL_NAME
    assert kept.id == first.id and kept.output_text == first.output_text
    assert first.usage is not None
    # vLLM's own /v1/responses adds the tokenizer's BOS to the template's: one more token
    assert first.usage.input_tokens == expected + (1 if native else 0)
    assert kinds[0] == "response.created" and kinds[-1] in (
        "response.completed", "response.incomplete",
    )  # fmt: skip
    assert "response.output_text.delta" in kinds
    assert (one.api, two.api) == ("responses", "responses")
    assert one.session_id == two.session_id == session["session-id"]
    assert two.decode_instance == one.decode_instance  # the stored context lands where it is
    assert two.prompt_tokens > one.prompt_tokens  # vLLM saw the rebuilt conversation
    assert two.cached_tokens >= 3 * 128
    assert two.predicted_cached_tokens == two.cached_tokens
