"""A Messages request through the gateway's intake (parse_request kind "messages"): the same
prompt ids and block hashes as the equivalent chat request on every token path, its
stable prefix, session fields, what is forwarded, and its refusals."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from services.common.tokens import TokenPath, token_path
from services.scheduler.http.messages import count_tokens, messages_answer
from services.scheduler.http.openai import ApiError, Limits, ParsedRequest, parse_request
from tests.helpers.model_dir import PARTS_TEMPLATE, write_model_dir

CLASSES = ("interactive", "agent")
SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}}}
MESSAGES: dict[str, Any] = {
    "model": "m",
    "max_tokens": 16,
    "system": [{"type": "text", "text": "you are a coding agent"}],
    "tools": [{"name": "read", "description": "read a file", "input_schema": SCHEMA}],
    "messages": [
        {"role": "user", "content": "read the file a.py please"},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "reading it"},
                {"type": "tool_use", "id": "toolu_1", "name": "read", "input": {"path": "a.py"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "print('hi')"},
                {"type": "text", "text": "now explain it", "cache_control": {"type": "ephemeral"}},
            ],
        },
    ],
}
# The same conversation as an OpenAI chat request.
CHAT: dict[str, Any] = {
    "model": "m",
    "max_tokens": 16,
    "tools": [{"type": "function", "function": {"name": "read", "parameters": SCHEMA, "description": "read a file"}}],
    "messages": [
        {"role": "system", "content": [{"type": "text", "text": "you are a coding agent"}]},
        {"role": "user", "content": "read the file a.py please"},
        {
            "role": "assistant",
            "content": [{"type": "text", "text": "reading it"}],
            "tool_calls": [{"id": "toolu_1", "type": "function", "function": {"name": "read", "arguments": json.dumps({"path": "a.py"})}}],
        },
        {"role": "tool", "tool_call_id": "toolu_1", "content": "print('hi')"},
        {"role": "user", "content": [{"type": "text", "text": "now explain it"}]},
    ],
}  # fmt: skip


def parse(kind: str, body: Any, headers: dict[str, str] | None = None, **kw: Any) -> ParsedRequest:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return parse_request(kind, raw, headers or {}, models=(), classes=CLASSES, **kw)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model_dir(tmp_path_factory.mktemp("parts"), template=PARTS_TEMPLATE)


@pytest.mark.parametrize("path", ["simulator", "vllm", "sglang"])
def test_messages_and_the_equivalent_chat_share_ids_and_block_hashes(
    path: str, model_dir: Path
) -> None:
    tokens = TokenPath() if path == "simulator" else token_path(model_dir, path)  # type: ignore[arg-type]
    m = parse("messages", MESSAGES, tokens=tokens)
    c = parse("chat", CHAT, tokens=tokens)
    assert m.prompt_ids == c.prompt_ids and len(m.prompt_ids) > 16
    assert tokens.block_hashes(m.prompt_ids, 4) == tokens.block_hashes(c.prompt_ids, 4)
    assert m.forward_body["messages"] == c.forward_body["messages"]
    assert m.tools_offered == c.tools_offered == 1
    assert m.tool_results == c.tool_results and m.tool_results[0].tool_call_id == "toolu_1"
    counted = count_tokens(json.dumps(MESSAGES).encode(), models=(), limits=Limits(), tokens=tokens)
    assert counted == len(m.prompt_ids)


def test_what_a_messages_request_carries() -> None:
    body = {**MESSAGES, "stream": True, "stop_sequences": ["END"], "metadata": {"user_id": "u1"}, "slo_class": "agent"}  # fmt: skip
    p = parse("messages", body, {"x-claude-code-session-id": "cc", "x-claude-code-agent-id": "a"})
    assert p.kind == "messages" and p.stream and p.max_tokens == 16 and p.slo_class == "agent"
    assert (p.session_id, p.parent_session_id, p.session_final) == ("a", "cc", False)
    assert p.forward_body["stream_options"] == {"include_usage": True}
    assert "slo_class" not in p.forward_body and "system" not in p.forward_body
    assert p.native_body is not None and "slo_class" not in p.native_body
    assert p.native_body["system"] == MESSAGES["system"] and p.raw_body == b""
    answer = messages_answer(p, native=False)
    assert answer is not None and answer.stop_sequences == ("END",)
    assert answer.input_tokens == len(p.prompt_ids) and answer.path == "/v1/chat/completions"
    native = messages_answer(p, native=True)
    assert native is not None and native.path == "/v1/messages"
    assert parse("messages", {**MESSAGES, "metadata": {"user_id": "u1"}}).session_id == "u1"


def test_stable_prefix_from_the_last_cache_mark() -> None:
    whole = parse("messages", MESSAGES)
    assert whole.stable_prefix_tokens == len(whole.prompt_ids)  # the mark is on the last block
    calls: list[Any] = []

    class Counting(TokenPath):
        def encode_chat(
            self, messages: Any, tools: Any = None, *, special_tokens: bool = False
        ) -> list[int]:
            calls.append(messages)
            return super().encode_chat(messages, tools, special_tokens=special_tokens)

    parse("messages", MESSAGES, tokens=Counting())
    assert len(calls) == 1  # a mark at the end costs no second rendering
    first = json.loads(json.dumps(MESSAGES))
    first["messages"][2]["content"][1].pop("cache_control")
    first["system"][0]["cache_control"] = {"type": "ephemeral"}
    p = parse("messages", first)
    system_only = TokenPath().encode_chat([{"role": "system", "content": "you are a coding agent"}])
    assert p.stable_prefix_tokens == len(system_only) < len(p.prompt_ids)
    first["system"][0].pop("cache_control")
    assert parse("messages", first).stable_prefix_tokens is None
    assert parse("chat", CHAT).stable_prefix_tokens is None


REFUSALS = [
    pytest.param({**MESSAGES, "max_tokens": None}, 400, "max_tokens", id="max_tokens-required"),
    pytest.param({**MESSAGES, "max_tokens": 10**9}, 400, "max_tokens", id="max_tokens-over-limit"),
    pytest.param({**MESSAGES, "messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": 1}]}]}, 400, "tool_use_id", id="malformed-tool_result"),
    pytest.param({**MESSAGES, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, 400, "image", id="image"),
    pytest.param(b"{nope", 400, "invalid JSON", id="bad-json"),
    pytest.param(b"x" * 3000, 413, "body over", id="body-too-large"),
    pytest.param({**MESSAGES, "messages": [{"role": "user", "content": "w " * 500}]}, 413, "tokens is over", id="prompt-too-long"),
]  # fmt: skip


@pytest.mark.parametrize(("body", "status", "needle"), REFUSALS)
def test_refusals(body: Any, status: int, needle: str) -> None:
    lim = Limits(max_body_bytes=2048, max_prompt_tokens=300, max_tokens=1000)
    with pytest.raises(ApiError) as e:
        parse("messages", body, limits=lim)
    assert e.value.status == status and needle in e.value.message, e.value.message


def test_unknown_model_is_404() -> None:
    raw = json.dumps({**MESSAGES, "model": "other"}).encode()
    with pytest.raises(ApiError) as e:
        parse_request("messages", raw, {}, models=("m",), classes=CLASSES)
    assert e.value.status == 404
