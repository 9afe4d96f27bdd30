"""The translators hand the request record the usage chunk they parsed (so the record does
not parse the stream's tail again), with the same usage the tail gives; and the Anthropic
events written from templates are the bytes the JSON encoder writes."""

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
}  # fmt: skip


def _streamed(data: bytes) -> RequestContext:
    ctx = RequestContext(request_id="r", trace_id="t", arrival=0.0, arrival_wall=0.0)
    ctx.answering(0.0, True)
    ctx.chunk(data)
    return ctx


def _translated(kind: str, data: bytes) -> dict[str, Any] | None:
    """The usage chunk the translator of ``kind`` hands the record."""
    if kind == "responses":
        req = parse_responses({"model": "m", "input": "q", "stream": True})
        rt = ChatToResponses(req, "resp_a", 1, False)
        rt.feed(data)
        rt.final()
        return rt.usage_chunk
    st_ = StreamTranslator(model="m")
    st_.feed(data)
    return st_.usage_chunk


@pytest.mark.parametrize("kind", ["responses", "messages"])
@pytest.mark.parametrize("data", list(STREAMS.values()), ids=list(STREAMS))
def test_the_translators_usage_is_the_tails(kind: str, data: bytes) -> None:
    from_tail = _streamed(data).answer()
    given_ctx = _streamed(data)
    given_ctx.usage_chunk = _translated(kind, data)
    assert given_ctx.answer() == from_tail


def test_the_messages_answer_hands_the_record_its_usage_chunk() -> None:
    ctx = _streamed(STREAMS["usage-only-chunk"])
    answer = MessagesAnswer(False, "m", ctx=ctx)
    answer.feed(STREAMS["usage-only-chunk"])
    asyncio.run(answer.end())
    assert ctx.usage_chunk is not None
    assert ctx.answer().usage == Usage(20, 3, 8)


def test_a_native_messages_answer_leaves_the_record_to_the_tail() -> None:
    ctx = _streamed(b"")
    answer = MessagesAnswer(True, "m", ctx=ctx)
    asyncio.run(answer.end())
    assert ctx.usage_chunk is None


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
