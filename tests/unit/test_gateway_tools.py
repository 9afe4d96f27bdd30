"""Agent tool calls per turn: extraction from OpenAI-shaped requests, whole answers and SSE
streams (chunk boundaries anywhere), and their place in the request record."""

from __future__ import annotations

import json
from typing import Any

import pytest

from services.scheduler.core.records import RequestContext, build_record
from services.scheduler.core.tools import (
    StreamToolCalls,
    ToolCallFact,
    ToolResultFact,
    tool_calls_of,
    tool_results_of,
    tools_offered,
)
from services.scheduler.http.openai import parse_request

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
SEARCH = {"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}
ARGS = '{"city": "Zürich"}'  # 19 bytes in UTF-8 (ü is two)


def assistant_calls(*calls: tuple[str, str, str]) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": i, "type": "function", "function": {"name": n, "arguments": a}}
            for i, n, a in calls
        ],
    }


TURN = [
    {"role": "system", "content": "You are an agent."},
    {"role": "user", "content": "Weather in Zürich, and news?"},
    assistant_calls(("call_1", "get_weather", ARGS), ("call_2", "search", '{"q":"news"}')),
    {"role": "tool", "tool_call_id": "call_1", "content": "12°C, cloudy"},
    {"role": "tool", "tool_call_id": "call_2", "content": [{"type": "text", "text": "none"}]},
]


@pytest.mark.parametrize(
    ("messages", "keep", "expected"),
    [
        (TURN, False, (ToolResultFact("call_1", "get_weather", 13), ToolResultFact("call_2", "search", 4))),
        (
            TURN,
            True,
            (
                ToolResultFact("call_1", "get_weather", 13, "12°C, cloudy"),
                ToolResultFact("call_2", "search", 4, "none"),
            ),
        ),
        # A user message after the results still belongs to the same turn.
        (
            [*TURN, {"role": "user", "content": "thanks"}],
            False,
            (ToolResultFact("call_1", "get_weather", 13), ToolResultFact("call_2", "search", 4)),
        ),
        # Results of an earlier turn (before the last assistant message) are not this turn's.
        ([*TURN, {"role": "assistant", "content": "Done."}, {"role": "user", "content": "ok"}], False, ()),
        # An id the assistant message does not name: the tool message's own name, else "".
        (
            [assistant_calls(("a", "x", "{}")), {"role": "tool", "tool_call_id": "b", "name": "y", "content": "r"}],
            False,
            (ToolResultFact("b", "y", 1),),
        ),
        ([{"role": "user", "content": "hi"}], False, ()),
        ("not a list", False, ()),
    ],
    ids=["names-and-sizes", "contents-kept", "user-after-results", "earlier-turn", "unknown-id", "no-tools", "bad-messages"],
)  # fmt: skip
def test_tool_results_of(messages: Any, keep: bool, expected: tuple[ToolResultFact, ...]) -> None:
    assert tool_results_of(messages, keep) == expected


@pytest.mark.parametrize(
    ("body", "expected"),
    [({"tools": [WEATHER, SEARCH]}, 2), ({"tools": []}, 0), ({}, 0), ({"tools": "x"}, 0)],
    ids=["two", "empty", "absent", "malformed"],
)
def test_tools_offered(body: dict[str, Any], expected: int) -> None:
    assert tools_offered(body) == expected


def whole_answer(*calls: tuple[str, str, str]) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "choices": [
            {"index": 0, "message": assistant_calls(*calls), "finish_reason": "tool_calls"}
        ],
        "usage": {"prompt_tokens": 40, "completion_tokens": 12, "total_tokens": 52},
    }


@pytest.mark.parametrize(
    ("answer", "keep", "expected"),
    [
        (whole_answer(("call_9", "get_weather", ARGS)), False, (ToolCallFact("call_9", "get_weather", 19),)),
        (whole_answer(("call_9", "get_weather", ARGS)), True, (ToolCallFact("call_9", "get_weather", 19, ARGS),)),
        (
            {"choices": [{"index": 0, "message": {"role": "assistant", "content": "Hi"}}]},
            False,
            (),
        ),
        ({"error": {"message": "bad"}}, False, ()),
    ],
    ids=["call", "call-with-arguments", "plain-answer", "error-body"],
)  # fmt: skip
def test_tool_calls_of(answer: Any, keep: bool, expected: tuple[ToolCallFact, ...]) -> None:
    assert tool_calls_of(answer, keep) == expected


def sse(*events: dict[str, Any]) -> bytes:
    return b"".join(f"data: {json.dumps(e)}\n\n".encode() for e in events) + b"data: [DONE]\n\n"


def delta(d: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-2",
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": d, "finish_reason": finish}],
    }


def frag(index: int, *, id: str = "", name: str = "", args: str = "") -> dict[str, Any]:
    f: dict[str, Any] = {"index": index}
    if id:
        f["id"], f["type"] = id, "function"
    fn = {k: v for k, v in (("name", name), ("arguments", args)) if v or k == "arguments"}
    f["function"] = fn
    return f


# Two parallel calls, arguments in pieces, as OpenAI streams them.
STREAM = sse(
    delta({"role": "assistant", "content": None}),
    delta({"tool_calls": [frag(0, id="call_a", name="get_weather")]}),
    delta({"tool_calls": [frag(0, args='{"city": ')]}),
    delta({"tool_calls": [frag(0, args='"Zürich"}')]}),
    delta({"tool_calls": [frag(1, id="call_b", name="search", args='{"q":')]}),
    delta({"tool_calls": [frag(1, args='"news"}')]}),
    delta({}, finish="tool_calls"),
)
PLAIN = sse(delta({"role": "assistant", "content": "Hello"}), delta({}, finish="stop"))


def chunked(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


@pytest.mark.parametrize(
    ("stream", "size", "keep", "expected"),
    [
        (STREAM, len(STREAM), False, (ToolCallFact("call_a", "get_weather", 19), ToolCallFact("call_b", "search", 12))),
        (STREAM, 7, False, (ToolCallFact("call_a", "get_weather", 19), ToolCallFact("call_b", "search", 12))),
        (STREAM, 1, True, (ToolCallFact("call_a", "get_weather", 19, ARGS), ToolCallFact("call_b", "search", 12, '{"q":"news"}'))),
        (PLAIN, 5, False, ()),
    ],
    ids=["one-chunk", "7-byte-chunks", "byte-by-byte-with-arguments", "no-tool-calls"],
)  # fmt: skip
def test_stream_tool_calls(
    stream: bytes, size: int, keep: bool, expected: tuple[ToolCallFact, ...]
) -> None:
    acc = StreamToolCalls(keep=keep)
    for piece in chunked(stream, size):
        acc.feed(piece)
    assert acc.calls() == expected


def test_parse_request_takes_the_turns_tools() -> None:
    body = {"model": "m", "messages": TURN, "tools": [WEATHER, SEARCH], "max_tokens": 4}
    p = parse_request(
        "chat", json.dumps(body).encode(), {}, models=(), classes=("agent",), tool_contents=True
    )
    assert p.tools_offered == 2
    assert [(r.name, r.content) for r in p.tool_results] == [
        ("get_weather", "12°C, cloudy"),
        ("search", "none"),
    ]
    assert p.forward_body["tools"] == [WEATHER, SEARCH]  # forwarded unchanged


@pytest.mark.parametrize("keep", [False, True], ids=["sizes-only", "contents"])
def test_record_carries_the_turns_tool_calls(keep: bool) -> None:
    body = {"model": "m", "messages": TURN, "tools": [WEATHER], "stream": True}
    p = parse_request(
        "chat", json.dumps(body).encode(), {}, models=(), classes=("agent",), tool_contents=keep
    )
    t = RequestContext("r", "a" * 32, 1.0, 1000.0, tool_contents=keep)
    t.taken_in("r", p, 1.0)
    t.answering(1.1, True)
    for piece in chunked(STREAM, 11):
        t.chunk(piece)
    rec = build_record(t, status=200, finish=1.5, finish_wall=1000.5, deployment="d")
    assert (rec.api, rec.tools_offered) == ("chat", 1)
    assert [(r.tool_call_id, r.name, r.content_bytes, r.content) for r in rec.tool_results] == [
        ("call_1", "get_weather", 13, "12°C, cloudy" if keep else ""),
        ("call_2", "search", 4, "none" if keep else ""),
    ]
    assert [(c.id, c.name, c.argument_bytes, c.arguments) for c in rec.tool_calls] == [
        ("call_a", "get_weather", 19, ARGS if keep else ""),
        ("call_b", "search", 12, '{"q":"news"}' if keep else ""),
    ]


def test_whole_answer_tool_calls_on_record() -> None:
    t = RequestContext("r", "a" * 32, 1.0, 1000.0)
    t.whole(1.2, json.dumps(whole_answer(("call_9", "get_weather", ARGS))).encode())
    rec = build_record(t, status=200, finish=1.2, finish_wall=1000.2, deployment="d")
    assert [(c.id, c.name, c.argument_bytes, c.arguments) for c in rec.tool_calls] == [
        ("call_9", "get_weather", 19, "")
    ]
    assert (rec.prompt_tokens, rec.completion_tokens) == (40, 12)  # one parse, both facts
