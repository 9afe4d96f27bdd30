"""The gateway's Responses intake fed anything (hypothesis): a parsed request, or an
OpenAI-shaped 4xx, never another exception (which the gateway would answer 500). And the
stream translators fed any bytes never raise.

The intake runs without a store (no I/O: ``store: true`` and ``previous_response_id`` are
then 400s) and with a store that holds nothing."""

from __future__ import annotations

import asyncio
import json
from functools import partial
from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st

from services.common import jsonfast
from services.common.apis.responses import parse_responses
from services.common.apis.responses_native import NativeResponses, plain_event, usual_shape
from services.common.apis.responses_stream import ChatToResponses
from services.scheduler.core.records import RequestContext
from services.scheduler.http.openai import ApiError, parse_request
from services.scheduler.http.responses import ResponsesApi
from services.scheduler.responses.chain import StoredResponse

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 10**6) | st.floats() | st.text(max_size=8),
    lambda kids: (
        st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=6), kids, max_size=4)
    ),
    max_leaves=12,
)
PART = st.fixed_dictionaries(
    {"type": st.sampled_from(["input_text", "output_text", "input_image", "text", "x"])},
    optional={"text": st.one_of(st.text(max_size=12), JSON)},
)
ITEM = st.fixed_dictionaries(
    {},
    optional={
        "type": st.sampled_from(
            ["message", "function_call", "function_call_output", "reasoning", "x"]
        ),
        "role": st.sampled_from(["user", "assistant", "system", "developer", "tool", ""]),
        "content": st.one_of(st.text(max_size=12), st.lists(PART, max_size=3), JSON),
        "call_id": st.one_of(st.text(max_size=4), JSON),
        "name": st.one_of(st.text(max_size=4), JSON),
        "arguments": st.one_of(st.text(max_size=8), JSON),
        "output": st.one_of(st.text(max_size=8), st.lists(PART, max_size=2), JSON),
    },
)
BODY = st.fixed_dictionaries(
    {},
    optional={
        "model": st.one_of(st.just("m"), JSON),
        "input": st.one_of(st.text(max_size=20), st.lists(ITEM, max_size=5), JSON),
        "instructions": st.one_of(st.text(max_size=8), JSON),
        "tools": st.one_of(st.lists(st.fixed_dictionaries({"type": st.sampled_from(["function", "web_search"]), "name": st.one_of(st.text(max_size=4), JSON)}), max_size=2), JSON),
        "tool_choice": st.one_of(st.sampled_from(["auto", "none", "required", "x"]), JSON),
        "max_output_tokens": st.one_of(st.integers(-2, 10**7), JSON),
        "temperature": JSON,
        "stream": JSON,
        "store": JSON,
        "previous_response_id": st.one_of(st.just("resp_x"), JSON),
        "metadata": JSON,
        "background": JSON,
        "tenant": JSON,
        "slo_class": JSON,
    },
)  # fmt: skip


class EmptyStore:
    """A store holding nothing (and storing nothing)."""

    async def put(self, row: StoredResponse) -> None: ...
    async def get(self, rid: str, now: float) -> StoredResponse | None:
        return None

    async def chain(self, rid: str, now: float, max_depth: int) -> dict[str, StoredResponse]:
        return {}

    async def delete(self, rid: str, tenant: str) -> bool:
        return False

    async def sweep(self, now: float) -> int:
        return 0

    async def close(self) -> None: ...


def _intake(raw: bytes, api: ResponsesApi) -> None:
    ctx = RequestContext("r", "t", 0.0, 0.0)
    try:
        parse = partial(parse_request, "responses", raw, {}, models=(), classes={"agent"})
        parsed, turn = asyncio.run(api.parse(ctx, raw, lambda c: parse(canonical=c), 1 << 20))
    except ApiError as e:
        assert 400 <= e.status < 500, e.status
        body = e.body()["error"]
        assert isinstance(body["message"], str) and body["message"] and body["type"]
        return
    assert parsed.kind == "responses" and parsed.prompt_ids
    assert turn.admitted(parsed) is not None


@given(BODY)
@example({"model": "m", "input": [{"type": "function_call"}]})
@example({"model": "m", "input": "x", "previous_response_id": "resp_x"})
@example({"model": "m", "input": [{"role": "user", "content": [{"type": "input_image"}]}]})
def test_responses_intake_gives_a_request_or_a_4xx(body: dict[str, Any]) -> None:
    raw = json.dumps(body).encode()
    _intake(raw, ResponsesApi())
    _intake(raw, ResponsesApi(store=EmptyStore()))


@given(st.binary(max_size=200) | JSON.map(lambda v: json.dumps(v).encode()))
@example(b"\xff\xfe")
def test_responses_intake_survives_any_bytes(raw: bytes) -> None:
    _intake(raw, ResponsesApi())


CHUNKS = st.lists(
    st.one_of(
        st.binary(max_size=30),
        JSON.map(lambda v: f"data: {json.dumps(v)}\n\n".encode()),
        st.sampled_from([b"data: [DONE]\n\n", b"event: response.completed\n", b"\n\n"]),
    ),
    max_size=8,
)


@given(CHUNKS)
def test_stream_translators_never_raise(chunks: list[bytes]) -> None:
    req = parse_responses({"model": "m", "input": "q"})
    for t in (ChatToResponses(req, "resp_a", 1, True), NativeResponses(req, "resp_a", 1, True)):
        for c in chunks:
            assert isinstance(t.feed(c), bytes)
        assert t.final() and t.response is not None


PIECES = st.lists(
    st.sampled_from(
        [b"event: response.output_text.delta", b"event:x", b"\n", b"\n\n", b"data: {", b"data:{",
         b"data: [1]", b'"delta": "a"}', b'"response"', b"id: 3", b" ", b"}", b"data:  {"]
    ),
    max_size=16,
).map(b"".join)  # fmt: skip


@given(PIECES)
@example(b'event: x\ndata: {"a": 1}\n\nevent: y\ndata: {"b": 2}\n\n')
@example(b"event: x\ndata: {\n\n\nevent: y\ndata: {\n\n")
def test_the_usual_shape_holds_only_when_each_event_would_pass_through(s: bytes) -> None:
    """The one-pass shape check never says "usual" of events the per-event rule would
    rewrite for another reason than a response object: split as the stream is read (at each
    blank line from the left), each is plain or names a response."""
    if not s.endswith(b"\n\n") or b"\n\n\n" in s or not usual_shape(s):
        return
    events, rest = [], bytearray(s)
    while (end := rest.find(b"\n\n")) >= 0:
        events.append(bytes(rest[:end]))
        del rest[: end + 2]
    assert not rest and all(plain_event(e) is not None or b'"response"' in e for e in events)


def _native_event(kind: str, seq: int | None, response: bool, extra: str) -> bytes:
    obj: dict[str, Any] = {"type": kind}
    if seq is not None:
        obj["sequence_number"] = seq
    if response:
        obj["response"] = {"id": "resp_engine", "status": "in_progress", "store": False,
                           "metadata": {}, "output": [{"text": extra}]}  # fmt: skip
    else:
        obj["delta"] = extra
    return f"event: {kind}\ndata: {json.dumps(obj)}\n\n".encode()


NATIVE_EVENTS = st.lists(
    st.one_of(
        st.builds(
            _native_event,
            st.sampled_from(
                [
                    "response.created",
                    "response.output_text.delta",
                    "response.completed",
                    "response.failed",
                ]
            ),
            st.one_of(st.none(), st.integers(0, 50)),
            st.booleans(),
            st.text(max_size=8),
        ),
        st.sampled_from(
            [
                b'data: {"error": {"message": "m", "code": "c"}}\n\n',
                b"data: [DONE]\n\n",
                b": keep-alive\n\n",
                b"event: x\ndata: {\ndata: }\n\n",
                b"id: 3\n\n",
            ]
        ),
    ),
    max_size=10,
).map(b"".join)


@given(NATIVE_EVENTS, st.integers(1, 64))
def test_native_stream_in_pieces_is_the_same_as_event_by_event(s: bytes, step: int) -> None:
    """Runs of events passed on in one piece, their numbering read late: the bytes, the
    final event and its number are those of the rule applied to each event in turn."""
    req = parse_responses({"model": "m", "input": "q", "metadata": {"k": "v"}})
    fast, slow = NativeResponses(req, "resp_a", 1, True), NativeResponses(req, "resp_a", 1, True)
    got = b"".join(fast.feed(s[i : i + step]) for i in range(0, len(s), step)) + fast.final()
    want = slow._one_by_one(s) + slow.final()
    assert got == want
    assert (fast.final_seq, fast.response) == (slow.final_seq, slow.response)


def _chat_chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return b"data: " + json.dumps({"choices": [choice]}).encode() + b"\n\n"


CHAT_PIECES = st.lists(
    st.one_of(
        st.text(min_size=1, max_size=6).map(lambda t: _chat_chunk({"content": t})),
        st.tuples(st.integers(0, 1), st.text(max_size=6)).map(
            lambda c: _chat_chunk(
                {"tool_calls": [{"index": c[0], "function": {"name": "f", "arguments": c[1]}}]}
            )
        ),
    ),
    max_size=8,
)


@given(CHAT_PIECES, st.sampled_from([None, "stop", "length", "tool_calls"]))
def test_translated_events_are_written_as_the_encoder_writes_them(
    chunks: list[bytes], finish: str | None
) -> None:
    """The events written from templates are byte for byte what encoding their objects
    writes, and each names its own type."""
    req = parse_responses({"model": "m", "input": "q", "stream": True})
    t = ChatToResponses(req, "resp_a", 1, False)
    stream = b"".join(chunks) + _chat_chunk({}, finish) + b"data: [DONE]\n\n"
    out = t.feed(stream) + t.final()
    events = out.split(b"\n\n")
    assert events.pop() == b""
    for i, raw in enumerate(events):
        head, _, data = raw.partition(b"\ndata: ")
        obj = json.loads(data)
        assert head == b"event: " + obj["type"].encode()
        assert obj["sequence_number"] == i
        assert data == jsonfast.dumps(obj)
