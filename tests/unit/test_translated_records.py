"""The translators keep what the request record needs of the chat stream they parse (the
last usage chunk, the chunks naming tool calls), so the record does not parse the stream's
bytes a second time, and the record comes out as reading the bytes makes it; and the
Anthropic events written from templates are the bytes the JSON encoder writes."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.common import jsonfast
from services.common.apis.anthropic_stream import StreamTranslator
from services.common.apis.responses import parse_responses
from services.common.apis.responses_stream import ChatToResponses
from services.scheduler.core.records import RequestContext, Usage
from services.scheduler.http.messages import MessagesAnswer


def _chunk(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def _text(t: str, finish: str | None = None) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": {"content": t}, "finish_reason": finish}]}


def _call(index: int, args: str, name: str = "", cid: str = "") -> dict[str, Any]:
    fn = {"name": name, "arguments": args} if name else {"arguments": args}
    tc: dict[str, Any] = {"index": index, "function": fn}
    if cid:
        tc["id"] = cid
    return {"choices": [{"index": 0, "delta": {"tool_calls": [tc]}, "finish_reason": None}]}


USAGE = {"prompt_tokens": 20, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 8}}
DONE = b"data: [DONE]\n\n"
STREAMS = {
    "usage-in-finish-chunk": _chunk(_text("a")) + _chunk({**_text("b", "stop"), "usage": USAGE}) + DONE,
    "usage-only-chunk": _chunk(_text("a", "length")) + _chunk({"choices": [], "usage": USAGE}) + DONE,
    "null-usage-then-usage": _chunk({**_text("a"), "usage": None}) + _chunk({"choices": [], "usage": USAGE}) + DONE,
    "two-usages-last-wins": _chunk({"choices": [], "usage": {"prompt_tokens": 1}}) + _chunk({"choices": [], "usage": USAGE}) + DONE,
    "usage-then-not-an-object": _chunk({"choices": [], "usage": USAGE}) + _chunk({"choices": [], "usage": 5}) + DONE,
    "no-usage": _chunk(_text("a", "stop")) + DONE,
    "usage-then-error": _chunk({"choices": [], "usage": USAGE}) + _chunk({"error": {"message": "x"}}) + DONE,
    "no-done": _chunk({**_text("a", "stop"), "usage": USAGE}),
    "tool-calls": _chunk(_text("a")) + _chunk(_call(0, '{"x":', "f", "call_1")) + _chunk(_call(0, "1}"))
    + _chunk(_call(1, "{}", "g")) + _chunk({"choices": [], "usage": USAGE}) + DONE,
    "tool-call-crlf": (_chunk(_call(0, "{}", "f", "c")) + _chunk({"choices": [], "usage": USAGE}) + DONE).replace(b"\n", b"\r\n"),
    "tool-choice-named-not-called": _chunk({**_text("a"), "tool_choice": "auto"}) + DONE,
}  # fmt: skip


def _ctx() -> RequestContext:
    ctx = RequestContext(request_id="r", trace_id="t", arrival=0.0, arrival_wall=0.0)
    ctx.answering(0.0, True)
    return ctx


def _translate(kind: str, ctx: RequestContext, reads: list[bytes]) -> None:
    """The stream through the translator of ``kind`` as the relay feeds it."""
    if kind == "responses":
        req = parse_responses({"model": "m", "input": "q", "stream": True})
        rt = ChatToResponses(req, "resp_a", 1, False)
        ctx.facts = rt.facts
        for read in reads:
            ctx.chunk(read)
            rt.feed(read)
        rt.final()
        return
    answer = MessagesAnswer(False, "m", ctx=ctx)
    for read in reads:
        ctx.chunk(read)
        answer.feed(read)
    asyncio.run(answer.end())


@pytest.mark.parametrize("keep", [False, True], ids=["sizes", "contents"])
@pytest.mark.parametrize("step", [1, 7, 1 << 20], ids=["bytewise", "7-bytes", "whole"])
@pytest.mark.parametrize("kind", ["responses", "messages"])
@pytest.mark.parametrize("data", list(STREAMS.values()), ids=list(STREAMS))
def test_the_record_of_a_translated_stream_is_the_bytes_record(
    kind: str, data: bytes, step: int, keep: bool
) -> None:
    """The same record (a CRLF stream's: its LF form's, which the tail reader gets right;
    it finds no usage in CRLF events)."""
    reads = [data[i : i + step] for i in range(0, len(data), step)]
    from_bytes = _ctx()
    from_bytes.tool_contents = keep
    lf = data.replace(b"\r\n", b"\n")
    for read in [lf[i : i + step] for i in range(0, len(lf), step)]:
        from_bytes.chunk(read)
    translated = _ctx()
    translated.tool_contents = keep
    _translate(kind, translated, reads)
    assert translated.tail == b""  # the bytes were not kept
    assert translated.answer() == from_bytes.answer()


def test_the_messages_answer_hands_the_record_its_facts() -> None:
    ctx = _ctx()
    _translate("messages", ctx, [STREAMS["tool-calls"]])
    got = ctx.answer()
    assert got.usage == Usage(20, 3, 8)
    assert [(c.id, c.name, c.argument_bytes) for c in got.tool_calls] == [
        ("call_1", "f", 7),
        ("", "g", 2),
    ]


def test_a_native_messages_answer_leaves_the_record_to_the_bytes() -> None:
    ctx = _ctx()
    MessagesAnswer(True, "m", ctx=ctx)
    assert ctx.facts is None


CHAT_PIECES = st.lists(
    st.one_of(
        st.text(min_size=1, max_size=6).map(lambda t: _chunk(_text(t))),
        st.tuples(st.integers(0, 1), st.text(max_size=6)).map(
            lambda c: _chunk(
                {"choices": [{"index": 0, "delta": {"tool_calls": [
                    {"index": c[0], "function": {"name": "f", "arguments": c[1]}}]}}]}
            )
        ),
    ),
    max_size=8,
)  # fmt: skip


@given(CHAT_PIECES, st.sampled_from([None, "stop", "length", "tool_calls"]))
def test_anthropic_events_are_written_as_the_encoder_writes_them(
    chunks: list[bytes], finish: str | None
) -> None:
    t = StreamTranslator(model="m", input_tokens=3)
    out = t.feed(b"".join(chunks) + _chunk(_text("", finish)) + DONE)
    events = out.split(b"\n\n")
    assert events.pop() == b""
    for raw in events:
        head, _, data = raw.partition(b"\ndata: ")
        obj = json.loads(data)
        assert head == b"event: " + obj["type"].encode()
        assert data == jsonfast.dumps(obj)
