"""The Responses API ↔ canonical chat translation (services.common.apis): requests, whole
answers, and the stream translators fed at every chunk boundary."""

from __future__ import annotations

import json
from typing import Any

import pytest

from services.common.apis.responses import (
    ResponsesError,
    chat_body,
    parse_responses,
)
from services.common.apis.responses_answer import from_chat
from services.common.apis.responses_native import NativeResponses, plain_event
from services.common.apis.responses_stream import ChatToResponses, sse_events

M = "m"


def _user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


CALL_ITEM = {"type": "function_call", "call_id": "c1", "name": "read", "arguments": "{}"}
CHAT_CALL = {"id": "c1", "type": "function", "function": {"name": "read", "arguments": "{}"}}

REQUESTS = [
    ("string input", {"input": "hi"}, {"messages": [{"role": "user", "content": "hi"}]}),
    (
        "instructions first",
        {"input": "hi", "instructions": "be terse"},
        {"messages": [{"role": "system", "content": "be terse"}, {"role": "user", "content": "hi"}]},
    ),
    (
        "easy message, developer as system",
        {"input": [{"role": "developer", "content": "rules"}, {"role": "user", "content": "q"}]},
        {"messages": [{"role": "system", "content": "rules"}, {"role": "user", "content": "q"}]},
    ),
    (
        "several parts stay parts",
        {"input": [{"role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]}]},
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]},
    ),
    (
        "assistant output_text, then its call",
        {"input": [_user("q"), {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "ok"}]}, CALL_ITEM]},
        {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "ok", "tool_calls": [CHAT_CALL]}]},
    ),
    (
        "a call alone opens an assistant message; two calls share it",
        {"input": [_user("q"), CALL_ITEM, {**CALL_ITEM, "call_id": "c2"}]},
        {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": None, "tool_calls": [CHAT_CALL, {**CHAT_CALL, "id": "c2"}]}]},
    ),
    (
        "call output as a tool message; reasoning not rendered",
        {"input": [_user("q"), {"type": "reasoning", "summary": []}, CALL_ITEM, {"type": "function_call_output", "call_id": "c1", "output": "x"}]},
        {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": None, "tool_calls": [CHAT_CALL]}, {"role": "tool", "tool_call_id": "c1", "content": "x"}]},
    ),
    (
        "tools, tool_choice, sampling, stream, our fields",
        {
            "input": "hi",
            "tools": [{"type": "function", "name": "read", "description": "d", "parameters": {"type": "object"}}],
            "tool_choice": {"type": "function", "name": "read"},
            "max_output_tokens": 7,
            "temperature": 0.5,
            "top_p": 0.9,
            "stream": True,
            "slo_class": "agent",
            "cache_salt": "s",
            "store": False,
            "metadata": {"k": "v"},
        },
        {
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"type": "function", "function": {"name": "read", "description": "d", "parameters": {"type": "object"}}}],
            "tool_choice": {"type": "function", "function": {"name": "read"}},
            "max_tokens": 7,
            "temperature": 0.5,
            "top_p": 0.9,
            "stream": True,
            "stream_options": {"include_usage": True},
            "slo_class": "agent",
            "cache_salt": "s",
        },
    ),
    (
        "structured output and reasoning effort",
        {"input": "hi", "text": {"format": {"type": "json_schema", "name": "a", "schema": {"type": "object"}}}, "reasoning": {"effort": "low"}},
        {"messages": [{"role": "user", "content": "hi"}], "reasoning_effort": "low", "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object"}}}},
    ),
    (
        "json_object",
        {"input": "hi", "text": {"format": {"type": "json_object"}}},
        {"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "json_object"}},
    ),
    ("plain text format", {"input": "hi", "text": {"format": {"type": "text"}, "verbosity": "low"}}, {"messages": [{"role": "user", "content": "hi"}]}),
]  # fmt: skip


@pytest.mark.parametrize(
    ("body", "want"), [(b, w) for _, b, w in REQUESTS], ids=[i for i, _, _ in REQUESTS]
)
def test_request_to_canonical_chat(body: dict[str, Any], want: dict[str, Any]) -> None:
    assert chat_body(parse_responses({"model": M, **body})) == {"model": M, **want}


BAD = [
    ("not an object", [], None, "invalid_body"),
    ("no model", {"input": "x"}, "model", "missing"),
    ("no input", {"model": M}, "input", "missing"),
    ("input a number", {"model": M, "input": 3}, "input", "invalid_type"),
    ("image part", {"model": M, "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]}, "input", "unsupported_content"),
    ("unknown item", {"model": M, "input": [{"type": "web_search_call"}]}, "input", "unsupported_item"),
    ("bad role", {"model": M, "input": [{"role": "tool", "content": "x"}]}, "input", "invalid_value"),
    ("call without name", {"model": M, "input": [{"type": "function_call", "call_id": "c", "arguments": "{}"}]}, "input", "invalid_type"),
    ("hosted tool", {"model": M, "input": "x", "tools": [{"type": "web_search"}]}, "tools", "unsupported_tool"),
    ("bad tool_choice", {"model": M, "input": "x", "tool_choice": "sometimes"}, "tool_choice", "invalid_value"),
    ("max_output_tokens 0", {"model": M, "input": "x", "max_output_tokens": 0}, "max_output_tokens", "invalid_value"),
    ("store a string", {"model": M, "input": "x", "store": "yes"}, "store", "invalid_type"),
    ("background", {"model": M, "input": "x", "background": True}, "background", "unsupported_parameter"),
    ("unknown text format", {"model": M, "input": "x", "text": {"format": {"type": "grammar"}}}, "text.format", "invalid_value"),
    ("json_schema without schema", {"model": M, "input": "x", "text": {"format": {"type": "json_schema"}}}, "text.format", "invalid_value"),
    ("metadata not strings", {"model": M, "input": "x", "metadata": {"a": 1}}, "metadata", "invalid_type"),
]  # fmt: skip


@pytest.mark.parametrize(("body", "param", "code"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_requests_are_clear(body: Any, param: str | None, code: str) -> None:
    with pytest.raises(ResponsesError) as e:
        parse_responses(body)
    assert (e.value.param, e.value.code) == (param, code) and e.value.message


USAGE = {
    "prompt_tokens": 30,
    "completion_tokens": 5,
    "prompt_tokens_details": {"cached_tokens": 16},
}
TOOL_ANSWER = {
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "looking", "tool_calls": [CHAT_CALL]}, "finish_reason": "tool_calls"}],
    "usage": USAGE,
}  # fmt: skip


@pytest.mark.parametrize(
    ("finish", "status", "reason"),
    [("stop", "completed", None), ("tool_calls", "completed", None), ("length", "incomplete", "max_output_tokens")],
    ids=["stop", "tool_calls", "length"],
)  # fmt: skip
def test_whole_answer_to_response(finish: str, status: str, reason: str | None) -> None:
    req = parse_responses({"model": M, "input": "q", "metadata": {"k": "v"}})
    answer = {**TOOL_ANSWER, "choices": [{**TOOL_ANSWER["choices"][0], "finish_reason": finish}]}  # type: ignore[dict-item]
    r = from_chat(req, "resp_ab", 7, answer, store=True)
    assert (r["id"], r["object"], r["status"], r["created_at"], r["store"]) == (
        "resp_ab",
        "response",
        status,
        7,
        True,
    )
    assert r["incomplete_details"] == ({"reason": reason} if reason else None)
    assert r["output"][0]["type"] == "message" and r["output"][0]["content"][0]["text"] == "looking"
    assert r["output"][1] == {
        "id": "fc_ab_0",
        "type": "function_call",
        "status": "completed",
        "arguments": "{}",
        "call_id": "c1",
        "name": "read",
    }
    assert r["usage"] == {
        "input_tokens": 30,
        "input_tokens_details": {"cached_tokens": 16},
        "output_tokens": 5,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 35,
    }
    assert r["metadata"] == {"k": "v"}


def test_function_call_round_trip() -> None:
    """The output items of a tool-calling answer, fed back as the next turn's history,
    give the chat assistant message the engine produced."""
    req = parse_responses({"model": M, "input": "q"})
    r = from_chat(req, "resp_ab", 1, TOOL_ANSWER)
    result = {"type": "function_call_output", "call_id": "c1", "output": "data"}
    nxt = parse_responses({"model": M, "input": [result]})
    msgs = chat_body(nxt, [*req.items, *r["output"]])["messages"]
    assert msgs == [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "looking", "tool_calls": [CHAT_CALL]},
        {"role": "tool", "tool_call_id": "c1", "content": "data"},
    ]


def _chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
    evt = {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra}
    return f"data: {json.dumps(evt)}\n\n".encode()


CHAT_STREAM = b"".join(
    [
        _chunk({"role": "assistant", "content": ""}),
        _chunk({"content": "hel"}),
        _chunk({"content": "lo"}),
        _chunk({"tool_calls": [{"index": 0, "id": "c1", "type": "function", "function": {"name": "read", "arguments": ""}}]}),
        _chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"a"'}}]}),
        _chunk({"tool_calls": [{"index": 0, "function": {"arguments": ": 1}"}}]}),
        _chunk({}, "tool_calls"),
        b'data: {"choices": [], "usage": ' + json.dumps(USAGE).encode() + b"}\n\n",
        b"data: [DONE]\n\n",
    ]
)  # fmt: skip

WANT_KINDS = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.output_item.added",
    "response.function_call_arguments.delta",
    "response.function_call_arguments.delta",
    "response.function_call_arguments.done",
    "response.output_item.done",
    "response.completed",
]


def _events(data: bytes) -> list[dict[str, Any]]:
    buf = bytearray(data)
    out = []
    for name, payload in sse_events(buf):
        obj = json.loads(payload)
        assert obj["type"] == name
        out.append(obj)
    assert not buf
    return out


def _translate(pieces: list[bytes]) -> bytes:
    t = ChatToResponses(parse_responses({"model": M, "input": "q"}), "resp_ab", 1, store=True)
    out = b"".join(t.feed(p) for p in pieces)
    assert t.done
    return out + t.final()


def test_stream_events_and_final_response() -> None:
    events = _events(_translate([CHAT_STREAM]))
    assert [e["type"] for e in events] == WANT_KINDS
    assert [e["sequence_number"] for e in events] == list(range(len(WANT_KINDS)))
    assert (
        "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta") == "hello"
    )
    done = events[-1]["response"]
    answer = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "hello", "tool_calls": [{**CHAT_CALL, "function": {"name": "read", "arguments": '{"a": 1}'}}]}, "finish_reason": "tool_calls"}], "usage": USAGE}  # fmt: skip
    whole = from_chat(parse_responses({"model": M, "input": "q"}), "resp_ab", 1, answer, store=True)
    assert done == whole  # streamed and whole answers agree


@pytest.mark.parametrize("step", [1, 7, 64], ids=["every-byte", "7-bytes", "64-bytes"])
def test_stream_translation_is_the_same_at_any_chunk_boundary(step: int) -> None:
    want = _translate([CHAT_STREAM])
    assert _translate([CHAT_STREAM[i : i + step] for i in range(0, len(CHAT_STREAM), step)]) == want


@pytest.mark.parametrize("step", [1, 5, 64], ids=["every-byte", "5-bytes", "64-bytes"])
def test_crlf_stream_translates_as_lf_at_any_chunk_boundary(step: int) -> None:
    crlf = CHAT_STREAM.replace(b"\n", b"\r\n")  # a "\r" and its "\n" may arrive apart
    assert _translate([crlf[i : i + step] for i in range(0, len(crlf), step)]) == _translate(
        [CHAT_STREAM]
    )


def test_stream_translation_every_two_piece_split() -> None:
    want = _translate([CHAT_STREAM])
    for cut in range(len(CHAT_STREAM) + 1):
        assert _translate([CHAT_STREAM[:cut], CHAT_STREAM[cut:]]) == want, cut


@pytest.mark.parametrize(
    "tail",
    [b'data: {"error": {"message": "boom", "code": "upstream_error"}}\n\ndata: [DONE]\n\n', b""],
    ids=["error-event", "ended-early"],
)
def test_broken_stream_ends_failed(tail: bytes) -> None:
    t = ChatToResponses(parse_responses({"model": M, "input": "q"}), "resp_ab", 1, store=True)
    events = _events(t.feed(_chunk({"content": "hi"}) + tail) + t.final())
    assert events[-1]["type"] == "response.failed"
    assert (
        events[-1]["response"]["status"] == "failed" and events[-1]["response"]["error"]["message"]
    )
    assert [e["sequence_number"] for e in events] == list(range(len(events)))


NATIVE = b"".join(
    f"event: {k}\ndata: {json.dumps({'type': k, 'sequence_number': i, **f})}\n\n".encode()
    for i, (k, f) in enumerate(
        [
            ("response.created", {"response": {"id": "resp_engine", "store": False, "output": []}}),
            ("response.output_text.delta", {"item_id": "m", "delta": "hi"}),
            ("response.completed", {"response": {"id": "resp_engine", "store": False, "status": "completed", "output": []}}),
        ]
    )
)  # fmt: skip


@pytest.mark.parametrize("step", [1, 13, len(NATIVE)], ids=["every-byte", "13-bytes", "whole"])
def test_native_stream_passes_through_with_our_id(step: int) -> None:
    req = parse_responses({"model": M, "input": "q", "previous_response_id": "resp_prev"})
    t = NativeResponses(req, "resp_ours", 1, store=True)
    body = b"".join(t.feed(NATIVE[i : i + step]) for i in range(0, len(NATIVE), step))
    assert t.done and t.response is not None and t.final_seq == 2
    events = _events(body + t.final())
    assert [e["type"] for e in events] == [
        "response.created",
        "response.output_text.delta",
        "response.completed",
    ]
    for e in (events[0], events[2]):
        assert e["response"]["id"] == "resp_ours" and e["response"]["store"] is True
        assert e["response"]["previous_response_id"] == "resp_prev"


def test_native_stream_cut_short_ends_failed() -> None:
    req = parse_responses({"model": M, "input": "q"})
    t = NativeResponses(req, "resp_ours", 1, store=True)
    broken = b'data: {"error": {"message": "upstream stream broke", "code": "upstream_error"}}\n\ndata: [DONE]\n\n'
    events = _events(
        t.feed(NATIVE[: NATIVE.index(b"event: response.completed")] + broken) + t.final()
    )
    assert [e["type"] for e in events] == [
        "response.created",
        "response.output_text.delta",
        "error",
        "response.failed",
    ]
    assert [e["sequence_number"] for e in events] == [0, 1, 2, 3]
    assert events[2]["code"] == "upstream_error" and events[3]["response"]["status"] == "failed"


@pytest.mark.parametrize(
    ("raw", "plain"),
    [
        (b'event: response.output_text.delta\ndata: {"type": "x", "delta": "a"}', True),
        (b'event: response.output_text.delta\ndata:{"delta": "say \\"response\\""}', True),
        (b'event: response.created\ndata: {"response": {"id": "r"}}', False),
        (b'data: {"type": "response.output_text.delta"}', False),
        (b'event: x\ndata: {"a": 1}\ndata: {"b": 2}', False),
        (b"event: x\ndata: [DONE]", False),
        (b'event: x\nid: 3\ndata: {"a": 1}', False),
    ],
    ids=["delta", "quoted-word-in-text", "carries-response", "no-event-line", "two-data-lines",
         "not-an-object", "extra-field"],
)  # fmt: skip
def test_only_events_without_a_response_object_pass_through_as_sent(
    raw: bytes, plain: bool
) -> None:
    assert (plain_event(raw) is not None) is plain


def test_native_deltas_keep_the_engines_bytes_and_numbering() -> None:
    req = parse_responses({"model": M, "input": "q"})
    t = NativeResponses(req, "resp_ours", 1, store=False)
    delta = b'event: response.output_text.delta\r\ndata: {"type":"response.output_text.delta",  "sequence_number": 7, "delta":"x"}\r\n\r\n'
    assert t.feed(delta) == delta.replace(b"\r\n", b"\n")  # spacing and order as sent
    events = _events(t.final())
    assert events[0]["type"] == "response.failed" and events[0]["sequence_number"] == 8


def _delta(seq: int | None) -> bytes:
    num = f'"sequence_number":{seq},' if seq is not None else ""
    return f'event: response.output_text.delta\ndata: {{"type":"response.output_text.delta",{num}"delta":"x"}}\n\n'.encode()


@pytest.mark.parametrize(
    ("chunk", "next_seq"),
    [
        (_delta(3) + _delta(4) + _delta(5), 6),
        (_delta(3) + _delta(4) + _delta(None), 5),
        (_delta(None) + _delta(None), 0),
        (_delta(7) + _delta(8)[:20], 8),
    ],
    ids=["numbered", "last-unnumbered", "none-numbered", "partial-event-held"],
)
def test_a_chunk_of_deltas_goes_through_in_one_piece_and_keeps_the_numbering(
    chunk: bytes, next_seq: int
) -> None:
    req = parse_responses({"model": M, "input": "q"})
    t = NativeResponses(req, "resp_ours", 1, store=False)
    whole = chunk[: chunk.rfind(b"\n\n") + 2]
    assert t.feed(chunk) == whole
    assert _events(t.final())[-1]["sequence_number"] == next_seq
