"""The Anthropic Messages ⇄ chat-completions translation (services.common.apis): requests to
the canonical chat body, whole answers and SSE streams back, stop reasons, usage, errors."""

from __future__ import annotations

import json
from typing import Any

import pytest

from services.common.apis.anthropic import (
    MessagesError,
    error_body,
    error_type,
    from_openai_error,
    to_chat,
)
from services.common.apis.anthropic_answer import chat_usage, to_message
from services.common.apis.anthropic_stream import StreamTranslator

BASE: dict[str, Any] = {"model": "m", "max_tokens": 8}
SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}}}


def req(messages: list[Any], **kw: Any) -> dict[str, Any]:
    return {**BASE, "messages": messages, **kw}


TOOL_USE = {"type": "tool_use", "id": "toolu_1", "name": "read", "input": {"path": "a.py"}}
TOOL_CALL = {
    "id": "toolu_1",
    "type": "function",
    "function": {"name": "read", "arguments": json.dumps({"path": "a.py"})},
}

REQUESTS = [
    pytest.param(
        req([{"role": "user", "content": "hi"}]),
        {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]},
        id="string-content",
    ),
    pytest.param(
        req([{"role": "user", "content": "hi"}], system="be brief"),
        {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]},
        id="system-string",
    ),
    pytest.param(
        req([{"role": "user", "content": "hi"}], system=[{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]),
        {"messages": [{"role": "system", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}, {"role": "user", "content": "hi"}]},
        id="system-blocks",
    ),
    pytest.param(
        req([{"role": "user", "content": [{"type": "text", "text": "x"}]}, {"role": "assistant", "content": [{"type": "text", "text": "on it"}, TOOL_USE]}]),
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "x"}]}, {"role": "assistant", "content": [{"type": "text", "text": "on it"}], "tool_calls": [TOOL_CALL]}]},
        id="tool_use-to-tool_calls",
    ),
    pytest.param(
        req([{"role": "assistant", "content": [TOOL_USE]}, {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "body"}, {"type": "text", "text": "next"}]}]),
        {"messages": [{"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]}, {"role": "tool", "tool_call_id": "toolu_1", "content": "body"}, {"role": "user", "content": [{"type": "text", "text": "next"}]}]},
        id="tool_result-to-tool-message",
    ),
    pytest.param(
        req([{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [{"type": "text", "text": "e"}], "is_error": True}]}]),
        {"messages": [{"role": "tool", "tool_call_id": "t", "content": [{"type": "text", "text": "e"}]}]},
        id="tool_result-blocks-is_error",
    ),
    pytest.param(
        req([{"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": "s"}, {"type": "text", "text": "ok"}]}]),
        {"messages": [{"role": "assistant", "content": [{"type": "text", "text": "ok"}]}]},
        id="thinking-dropped",
    ),
    pytest.param(
        req([{"role": "user", "content": "x"}], tools=[{"name": "read", "description": "d", "input_schema": SCHEMA}], tool_choice={"type": "any", "disable_parallel_tool_use": True}),
        {"tools": [{"type": "function", "function": {"name": "read", "parameters": SCHEMA, "description": "d"}}], "tool_choice": "required", "parallel_tool_calls": False},
        id="tools-any",
    ),
    pytest.param(
        req([{"role": "user", "content": "x"}], tool_choice={"type": "tool", "name": "read"}),
        {"tool_choice": {"type": "function", "function": {"name": "read"}}},
        id="tool_choice-tool",
    ),
    pytest.param(req([{"role": "user", "content": "x"}], tool_choice={"type": "none"}), {"tool_choice": "none"}, id="tool_choice-none"),
    pytest.param(req([{"role": "user", "content": "x"}], tool_choice={"type": "auto"}), {"tool_choice": "auto"}, id="tool_choice-auto"),
    pytest.param(
        req([{"role": "user", "content": "x"}], stop_sequences=["END"], temperature=0.5, top_p=0.9, top_k=5, stream=True),
        {"stop": ["END"], "temperature": 0.5, "top_p": 0.9, "top_k": 5, "stream": True, "stream_options": {"include_usage": True}},
        id="sampling-and-stream",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("body", "want"), REQUESTS)
def test_request_to_canonical_chat(body: dict[str, Any], want: dict[str, Any]) -> None:
    chat = to_chat(body).body
    assert {k: chat.get(k) for k in want} == want
    assert "metadata" not in chat and "system" not in chat


BAD = [
    pytest.param("[]", None, id="not-an-object"),
    pytest.param({"max_tokens": 1, "messages": [{"role": "user", "content": "x"}]}, "model", id="no-model"),
    pytest.param({"model": "m", "messages": [{"role": "user", "content": "x"}]}, "max_tokens", id="no-max_tokens"),
    pytest.param(req([]), "messages", id="no-messages"),
    pytest.param(req([{"role": "system", "content": "x"}]), "messages", id="system-role"),
    pytest.param(req([{"role": "user", "content": [{"type": "image", "source": {}}]}]), "image", id="image"),
    pytest.param(req([{"role": "user", "content": [{"type": "document"}]}]), "document", id="document"),
    pytest.param(req([{"role": "user", "content": [{"type": "tool_result", "content": "x"}]}]), "tool_use_id", id="tool_result-no-id"),
    pytest.param(req([{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": 5}]}]), "content", id="tool_result-content-type"),
    pytest.param(req([{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [{"type": "image"}]}]}]), "image", id="tool_result-image"),
    pytest.param(req([{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "is_error": "yes"}]}]), "is_error", id="is_error-type"),
    pytest.param(req([{"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "n", "input": []}]}]), "input", id="tool_use-input"),
    pytest.param(req([{"role": "user", "content": "x"}], tools=[{"name": "n"}]), "input_schema", id="tool-no-schema"),
    pytest.param(req([{"role": "user", "content": "x"}], tools=[{"type": "web_search_20250305", "name": "w"}]), "server tools", id="server-tool"),
    pytest.param(req([{"role": "user", "content": "x"}], tool_choice={"type": "sometimes"}), "tool_choice", id="tool_choice"),
    pytest.param(req([{"role": "user", "content": "x"}], stop_sequences="END"), "stop_sequences", id="stop-type"),
    pytest.param(req([{"role": "user", "content": "x"}], temperature="hot"), "temperature", id="temperature"),
    pytest.param(req([{"role": "user", "content": "x"}], metadata={"user_id": 3}), "user_id", id="user_id"),
    pytest.param(req([{"role": "user", "content": "x"}], mcp_servers=[{}]), "mcp_servers", id="mcp"),
    pytest.param({**BASE, "max_tokens": 0, "messages": [{"role": "user", "content": "x"}]}, "max_tokens", id="max_tokens-0"),
]  # fmt: skip


@pytest.mark.parametrize(("body", "needle"), BAD)
def test_bad_requests_are_refused_with_a_clear_message(body: Any, needle: str | None) -> None:
    with pytest.raises(MessagesError) as e:
        to_chat(body)
    assert e.value.status == 400
    assert needle is None or needle in e.value.message


def test_count_tokens_body_needs_no_max_tokens() -> None:
    form = to_chat(
        {"model": "m", "messages": [{"role": "user", "content": "x"}]}, need_max_tokens=False
    )
    assert "max_tokens" not in form.body


MARK = {"type": "ephemeral"}
PREFIXES = [
    pytest.param(req([{"role": "user", "content": "x"}]), None, id="no-mark"),
    pytest.param(req([{"role": "user", "content": "x"}], tools=[{"name": "n", "input_schema": {}, "cache_control": MARK}]), 0, id="tools-only"),
    pytest.param(req([{"role": "user", "content": "x"}], system=[{"type": "text", "text": "s", "cache_control": MARK}]), 1, id="system"),
    pytest.param(
        req([{"role": "user", "content": [{"type": "text", "text": "a", "cache_control": MARK}]}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}]),
        1,
        id="first-user-turn",
    ),
    pytest.param(
        req([{"role": "user", "content": "a"}, {"role": "assistant", "content": [{"type": "text", "text": "b", "cache_control": MARK}]}, {"role": "user", "content": "c"}]),
        2,
        id="assistant-turn",
    ),
    pytest.param(
        req([{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "r", "cache_control": MARK}, {"type": "text", "text": "more"}]}]),
        1,
        id="mid-turn-tool_result",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("body", "n"), PREFIXES)
def test_cache_control_marks_the_stable_prefix(body: dict[str, Any], n: int | None) -> None:
    form = to_chat(body)
    if n is None:
        assert form.stable_prefix is None
        return
    assert form.stable_prefix is not None and len(form.stable_prefix) == n
    assert form.stable_prefix == form.body["messages"][:n] or n == 1  # a mid-turn cut is partial


def _chat_answer(message: dict[str, Any], finish: str, **choice: Any) -> dict[str, Any]:
    usage = {
        "prompt_tokens": 30,
        "completion_tokens": 4,
        "prompt_tokens_details": {"cached_tokens": 16},
    }
    return {"id": "c1", "choices": [{"index": 0, "message": message, "finish_reason": finish, **choice}], "usage": usage}  # fmt: skip


ANSWERS = [
    pytest.param(_chat_answer({"content": "hello"}, "stop"), [{"type": "text", "text": "hello"}], "end_turn", None, id="end_turn"),
    pytest.param(_chat_answer({"content": "hel"}, "length"), [{"type": "text", "text": "hel"}], "max_tokens", None, id="max_tokens"),
    pytest.param(_chat_answer({"content": "x"}, "stop", stop_reason="END"), [{"type": "text", "text": "x"}], "stop_sequence", "END", id="stop_sequence"),
    pytest.param(_chat_answer({"content": "x"}, "stop", stop_reason="OTHER"), [{"type": "text", "text": "x"}], "end_turn", None, id="unknown-stop-string"),
    pytest.param(
        _chat_answer({"content": None, "tool_calls": [TOOL_CALL]}, "tool_calls"),
        [{"type": "tool_use", "id": "toolu_1", "name": "read", "input": {"path": "a.py"}}],
        "tool_use",
        None,
        id="tool_use",
    ),
    pytest.param(
        _chat_answer({"content": "t", "tool_calls": [{"id": "c", "function": {"name": "n", "arguments": "{bad"}}]}, "stop"),
        [{"type": "text", "text": "t"}, {"type": "tool_use", "id": "c", "name": "n", "input": {"_raw": "{bad"}}],
        "tool_use",
        None,
        id="tool-call-with-stop-and-bad-json",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("chat", "content", "reason", "seq"), ANSWERS)
def test_whole_answer_to_message(
    chat: dict[str, Any], content: list[Any], reason: str, seq: str | None
) -> None:
    msg = to_message(chat, model="claude-x", stop_sequences=["END"])
    assert msg["type"] == "message" and msg["role"] == "assistant" and msg["model"] == "claude-x"
    assert msg["content"] == content
    assert (msg["stop_reason"], msg["stop_sequence"]) == (reason, seq)
    assert msg["usage"] == {
        "input_tokens": 14,
        "output_tokens": 4,
        "cache_read_input_tokens": 16,
        "cache_creation_input_tokens": 0,
    }


@pytest.mark.parametrize(
    ("details", "expected"),
    [
        ({"cached_tokens": 16}, (14, 16, 0)),
        ({"cached_tokens": 16, "created_cache_tokens": 8}, (6, 16, 8)),
        ({"cached_tokens": 0, "created_cache_tokens": 30}, (0, 0, 30)),
        ({"cached_tokens": 40}, (0, 30, 0)),
        (None, (30, 0, 0)),
    ],
    ids=["read", "read-and-written", "all-written", "read-capped", "no-details"],
)
def test_usage_splits_the_prompt_as_vllm_does(
    details: dict[str, int] | None, expected: tuple[int, int, int]
) -> None:
    """input + cache read + cache written = the prompt, as vLLM's native /v1/messages says."""
    usage = {"prompt_tokens": 30, "completion_tokens": 2, "prompt_tokens_details": details}
    got = chat_usage(usage)
    assert (
        got["input_tokens"],
        got["cache_read_input_tokens"],
        got["cache_creation_input_tokens"],
    ) == expected


def test_a_garbage_answer_is_still_a_message() -> None:
    msg = to_message(None, model="m")
    assert msg["content"] == [] and msg["stop_reason"] == "end_turn"
    assert msg["usage"]["input_tokens"] == 0


@pytest.mark.parametrize(
    ("status", "etype"),
    [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (403, "permission_error"),
        (404, "not_found_error"),
        (413, "request_too_large"),
        (422, "invalid_request_error"),
        (429, "rate_limit_error"),
        (431, "invalid_request_error"),
        (500, "api_error"),
        (502, "api_error"),
        (503, "overloaded_error"),
        (529, "overloaded_error"),
    ],
    ids=str,
)
def test_error_types_by_status(status: int, etype: str) -> None:
    assert error_type(status) == etype
    assert error_body(status, "m") == {"type": "error", "error": {"type": etype, "message": "m"}}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        pytest.param(b'{"error": {"message": "bad thing", "type": "x"}}', "bad thing", id="openai"),
        pytest.param(b'{"type": "error", "error": {"type": "api_error", "message": "k"}}', "k", id="anthropic"),
        pytest.param(b'{"error": "flat"}', "flat", id="flat"),
        pytest.param(b"Internal Server Error", "Internal Server Error", id="text"),
        pytest.param(b"", "upstream answered HTTP 500", id="empty"),
    ],
)  # fmt: skip
def test_errors_from_any_upstream_shape(body: bytes, message: str) -> None:
    got = from_openai_error(500, body)
    assert got["type"] == "error" and got["error"]["message"] == message


# -- streams -------------------------------------------------------------------------------
def _chunk(
    delta: dict[str, Any], finish: str | None = None, stop: str | None = None, **extra: Any
) -> bytes:
    choice = {"index": 0, "delta": delta, "finish_reason": finish, "stop_reason": stop}
    evt = {"id": "c9", "choices": [choice], **extra}
    return f"data: {json.dumps(evt)}\n\n".encode()


USAGE = {"prompt_tokens": 20, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 8}}
TEXT_STREAM = [
    _chunk({"role": "assistant", "content": "héllo"}),
    _chunk({"content": " wörld"}),
    _chunk({}, "stop", "END"),
    f"data: {json.dumps({'id': 'c9', 'choices': [], 'usage': USAGE})}\n\n".encode(),
    b"data: [DONE]\n\n",
]
TOOL_STREAM = [
    _chunk({"role": "assistant", "content": "let me look"}),
    _chunk(
        {
            "tool_calls": [
                {"index": 0, "id": "call_a", "function": {"name": "read", "arguments": ""}}
            ]
        }
    ),
    _chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"path": '}}]}),
    _chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"a.py"}'}}]}),
    _chunk(
        {
            "tool_calls": [
                {"index": 1, "id": "call_b", "function": {"name": "ls", "arguments": "{}"}}
            ]
        }
    ),
    _chunk({}, "tool_calls", usage=USAGE),
    b"data: [DONE]\n\n",
]


def events(data: bytes) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for block in data.decode().split("\n\n"):
        if block.strip():
            name, payload = block.split("\n", 1)
            out.append((name.removeprefix("event: "), json.loads(payload.removeprefix("data: "))))
    return out


def translate(pieces: list[bytes]) -> bytes:
    t = StreamTranslator(model="claude-x", stop_sequences=["END"], input_tokens=20)
    return b"".join(t.feed(p) for p in pieces)


def accumulate(evts: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """What a client builds from the events (as the SDK's stream helper does)."""
    msg: dict[str, Any] = {}
    for name, e in evts:
        if name == "message_start":
            msg = {**e["message"], "content": []}
        elif name == "content_block_start":
            assert e["index"] == len(msg["content"])
            msg["content"].append({**e["content_block"], "_json": ""})
        elif name == "content_block_delta":
            b, d = msg["content"][e["index"]], e["delta"]
            if d["type"] == "text_delta":
                b["text"] += d["text"]
            else:
                b["_json"] += d["partial_json"]
        elif name == "message_delta":
            msg.update(e["delta"])
            msg["usage"] = {**msg["usage"], **e["usage"]}
    for b in msg["content"]:
        raw = b.pop("_json")
        if b["type"] == "tool_use":
            b["input"] = json.loads(raw)
    return msg


@pytest.mark.parametrize("stream", [TEXT_STREAM, TOOL_STREAM], ids=["text", "tools"])
def test_stream_events_are_the_same_at_every_chunk_boundary(stream: list[bytes]) -> None:
    whole = b"".join(stream)
    want = translate([whole])
    for cut in range(1, len(whole)):
        assert translate([whole[:cut], whole[cut:]]) == want, cut
    assert translate([whole[i : i + 1] for i in range(len(whole))]) == want


def test_text_stream_sequence_stop_sequence_and_usage() -> None:
    evts = events(translate(TEXT_STREAM))
    names = [n for n, _ in evts]
    assert names == [
        "message_start",
        "ping",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    msg = accumulate(evts)
    assert msg["content"] == [{"type": "text", "text": "héllo wörld"}]
    assert (msg["stop_reason"], msg["stop_sequence"]) == ("stop_sequence", "END")
    assert msg["usage"]["input_tokens"] == 12 and msg["usage"]["cache_read_input_tokens"] == 8
    assert msg["usage"]["output_tokens"] == 3 and msg["model"] == "claude-x"


def test_tool_stream_becomes_tool_use_blocks_with_input_json_delta() -> None:
    evts = events(translate(TOOL_STREAM))
    msg = accumulate(evts)
    assert msg["content"] == [
        {"type": "text", "text": "let me look"},
        {"type": "tool_use", "id": "call_a", "name": "read", "input": {"path": "a.py"}},
        {"type": "tool_use", "id": "call_b", "name": "ls", "input": {}},
    ]
    assert msg["stop_reason"] == "tool_use"
    deltas = [e["delta"]["type"] for n, e in evts if n == "content_block_delta"]
    assert deltas == ["text_delta", "input_json_delta", "input_json_delta", "input_json_delta"]
    stops = [e["index"] for n, e in evts if n == "content_block_stop"]
    assert stops == [0, 1, 2]


def test_upstream_error_event_and_a_broken_stream_are_error_events() -> None:
    t = StreamTranslator(model="m")
    evts = events(t.feed(b'data: {"error": {"message": "boom"}}\n\n'))
    assert [n for n, _ in evts] == ["message_start", "ping", "error"]
    assert evts[-1][1]["error"]["message"] == "boom" and t.finished
    assert t.feed(b"data: [DONE]\n\n") == b""  # nothing after the error
    t2 = StreamTranslator(model="m")
    t2.feed(TEXT_STREAM[0])
    name, body = events(t2.fail("upstream stream broke"))[0]
    assert name == "error" and body["error"]["type"] == "api_error"


def test_an_empty_stream_still_ends_as_a_message() -> None:
    evts = events(translate([b"data: [DONE]\n\n"]))
    assert [n for n, _ in evts] == ["message_start", "ping", "message_delta", "message_stop"]
