"""Streams at their edges: a lone surrogate escape in the engine's chunks (both translators
write what the JSON encoder writes for it and never raise), the usage of streams whose
lines end in CRLF or CR (the chat and native records read it), and the usual text chunk
read without parsing it (:class:`~services.common.apis.chat_chunks.TextChunks`: the
translators' output is the same as when every chunk is parsed)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.common import jsonfast
from services.common.apis.anthropic_stream import StreamTranslator
from services.common.apis.chat_chunks import TextChunks
from services.common.apis.responses import parse_responses
from services.common.apis.responses_answer import response_object
from services.common.apis.responses_stream import ChatToResponses, _event, final_event
from services.scheduler.core.records import RequestContext, Usage
from services.scheduler.http.messages import MessagesAnswer

USAGE = {"prompt_tokens": 20, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 8}}
DONE = b"data: [DONE]\n\n"


def _data(raw: str) -> bytes:
    return b"data: " + raw.encode() + b"\n\n"


def _text_chunk(escaped: str, finish: str = "null") -> bytes:
    """A chunk whose text is ``escaped`` as written in the JSON (escapes kept)."""
    return _data(
        '{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":'
        f'[{{"index":0,"delta":{{"content":"{escaped}"}},"finish_reason":{finish}}}]}}'
    )


def _call_chunk(name: str, args: str) -> bytes:
    return _data(
        '{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1",'
        f'"function":{{"name":"{name}","arguments":"{args}"}}}}]}},"finish_reason":null}}]}}'
    )


def _usage_chunk() -> bytes:
    return _data(json.dumps({"choices": [], "usage": USAGE}))


def _events(out: bytes) -> list[tuple[bytes, Any]]:
    """Each event's name line and data, checked to be what the encoder writes."""
    events = []
    for raw in out.split(b"\n\n")[:-1]:
        head, _, data = raw.partition(b"\ndata: ")
        obj = json.loads(data)
        assert data == jsonfast.dumps(obj), data
        events.append((head, obj))
    return events


SURROGATES = {
    "lone-high-in-text": (_text_chunk("a\\ud800b"), "a\ud800b", b'"a\\ud800b"'),
    "lone-low-in-text": (_text_chunk("\\udc00"), "\udc00", b'"\\udc00"'),
    "pair-in-text": (_text_chunk("\\ud83d\\ude00"), "\U0001f600", '"\U0001f600"'.encode()),
    "lone-then-plain-text": (_text_chunk("x\\ud800") + _text_chunk("y"), "x\ud800y", b'"y"'),
    "lone-in-tool-arguments": (_call_chunk("f", "{\\ud800"), "", b'"{\\ud800"'),
    "lone-in-tool-name": (_call_chunk("f\\udfff", "{}"), "", b'"f\\udfff"'),
}  # fmt: skip


@pytest.mark.parametrize(("stream", "text", "written"), SURROGATES.values(), ids=list(SURROGATES))
def test_a_lone_surrogate_is_written_as_its_escape(
    stream: bytes, text: str, written: bytes
) -> None:
    """The chat path passes the engine's escape through; the translators write the same
    escape (what ``json.dumps`` writes), so every client reads the same text."""
    whole = stream + _usage_chunk() + DONE
    ctx = RequestContext("r", "t", 0.0, 0.0)
    ctx.answering(0.0, True)
    t = ChatToResponses(parse_responses({"model": "m", "input": "q"}), "resp_a", 1, False)
    ctx.facts = t.facts
    out = b"".join(t.feed(whole[i : i + 5]) for i in range(0, len(whole), 5)) + t.final()
    assert written in out
    events = _events(out)
    assert events[-1][1]["type"] == "response.completed"
    done = [o for _, o in events if o["type"] == "response.output_text.done"]
    assert [o["text"] for o in done] == ([text] if text else [])
    assert ctx.answer().usage == Usage(20, 3, 8)
    ctx = RequestContext("r", "t", 0.0, 0.0)
    ctx.answering(0.0, True)
    m = MessagesAnswer(False, "m", (), 3, ctx)
    out = b"".join(m.feed(whole[i : i + 5]) for i in range(0, len(whole), 5))
    assert written in out
    assert _events(out)[-1][1]["type"] == "message_stop"
    assert ctx.answer().usage == Usage(20, 3, 8)


@pytest.mark.parametrize(
    ("value", "written"),
    [("\ud800", b'"\\ud800"'), ({"k\udc00": ["a\ud83d"]}, b'{"k\\udc00":["a\\ud83d"]}'),
     ("\U0001f600", '"\U0001f600"'.encode()), (2**70, b"1180591620717411303424")],
    ids=["lone-high", "in-key-and-list", "astral-char", "big-int"],
)  # fmt: skip
def test_jsonfast_writes_a_lone_surrogate_as_json_dumps_does(value: Any, written: bytes) -> None:
    assert jsonfast.dumps(value) == written
    assert json.loads(written) == value


CHAT = (
    _data(json.dumps({"choices": [{"index": 0, "delta": {"content": "a"}, "finish_reason": None}]}))
    + _usage_chunk()
    + DONE
)
MESSAGES_NATIVE = (
    b'event: message_start\ndata: {"type":"message_start","message":{"usage":'
    b'{"input_tokens":12,"output_tokens":1}}}\n\n'
    b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"end_turn"},'
    b'"usage":{"input_tokens":12,"output_tokens":5,"cache_read_input_tokens":4}}\n\n'
    b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
)


@pytest.mark.parametrize(
    ("stream", "usage"),
    [(CHAT, Usage(20, 3, 8)), (CHAT.replace(b"\n", b"\r\n"), Usage(20, 3, 8)),
     (CHAT.replace(b"\n", b"\r"), Usage(20, 3, 8)),
     (MESSAGES_NATIVE, Usage(16, 5, 4)), (MESSAGES_NATIVE.replace(b"\n", b"\r\n"), Usage(16, 5, 4))],
    ids=["chat-lf", "chat-crlf", "chat-cr", "messages-native-lf", "messages-native-crlf"],
)  # fmt: skip
@pytest.mark.parametrize("step", [1, 7, 1 << 20], ids=["bytewise", "7-bytes", "whole"])
def test_the_record_reads_usage_whatever_the_line_ends(
    stream: bytes, usage: Usage, step: int
) -> None:
    ctx = RequestContext("r", "t", 0.0, 0.0)
    ctx.answering(0.0, True)
    for i in range(0, len(stream), step):
        ctx.chunk(stream[i : i + step])
    assert ctx.answer().usage == usage


def _chunk(obj: dict[str, Any], compact: bool) -> bytes:
    seps = (",", ":") if compact else (", ", ": ")
    return b"data: " + json.dumps(obj, separators=seps, ensure_ascii=False).encode() + b"\n\n"


TEXTS = st.sampled_from(["tok", " a", "é", 'q"', "\\", "\n", "\x7f", "", "\u2028", "😀", "x\ty"])
PIECE = st.one_of(
    TEXTS.map(lambda t: {"content": t}),
    TEXTS.map(lambda t: {"role": "assistant", "content": t}),
    st.just(
        {"tool_calls": [{"index": 0, "id": "c", "function": {"name": "f", "arguments": "{}"}}]}
    ),
)
STREAM = st.tuples(
    st.lists(st.tuples(PIECE, st.sampled_from([None, None, None, "stop"]), st.booleans()), max_size=12),
    st.sampled_from(["c1", "chatcmpl-é", "tok"]),
    st.booleans(),
    st.lists(st.integers(1, 40), max_size=4),
)  # fmt: skip


def _stream(spec: Any) -> tuple[list[bytes], bytes]:
    chunks, cid, compact, cuts = spec
    body = b"".join(
        _chunk(
            {"id": cid, "object": "chat.completion.chunk", "created": 1 + (i // 5 if late else 0),
             "model": "m", "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                        "finish_reason": finish}]},
            compact,
        )
        for i, (delta, finish, late) in enumerate(chunks)
    ) + _usage_chunk() + DONE  # fmt: skip
    reads, at = [], 0
    for n in cuts:
        reads.append(body[at : at + n])
        at += n
    return [*reads, body[at:]], body


class ParseAll(TextChunks):
    """Reads no chunk unparsed: every chunk is parsed, as before :class:`TextChunks`."""

    def text(self, payload: bytes) -> tuple[bytes, str] | None:
        return None


def _translated(reads: list[bytes], parse_all: bool) -> tuple[bytes, bytes]:
    t = ChatToResponses(parse_responses({"model": "m", "input": "q"}), "resp_a", 1, False)
    m = StreamTranslator(model="m", input_tokens=3)
    if parse_all:
        t._texts = m._texts = ParseAll()
    a = b"".join(t.feed(r) for r in reads) + t.final()
    return a, b"".join(m.feed(r) for r in reads)


@given(STREAM)
def test_text_chunks_read_unparsed_translate_as_parsed(spec: Any) -> None:
    reads, _ = _stream(spec)
    assert _translated(reads, False) == _translated(reads, True)


@pytest.mark.parametrize(
    ("learnt", "payload", "want"),
    [
        (b'{"id":"c","choices":[{"index":0,"delta":{"content":"ab"},"finish_reason":null}]}',
         b'{"id":"c","choices":[{"index":0,"delta":{"content":"x y"},"finish_reason":null}]}',
         (b'"x y"', "x y")),
        (b'{"id":"ab","choices":[{"index":0,"delta":{"content":"ab"},"finish_reason":null}]}',
         b'{"id":"ab","choices":[{"index":0,"delta":{"content":"\xc3\xa9"},"finish_reason":null}]}',
         ('"\u00e9"'.encode(), "\u00e9")),
        (b'{"choices":[{"index":0,"delta":{"content":"ab"},"finish_reason":null}],"x":"ab"}',
         b'{"choices":[{"index":0,"delta":{"content":"ab"},"finish_reason":null}],"x":"zz"}',
         None),
        (b'{"id":"c","choices":[{"index":0,"delta":{"content":"ab"},"finish_reason":null}]}',
         b'{"id":"c","choices":[{"index":0,"delta":{"content":"a\\"b"},"finish_reason":null}]}',
         None),
        (b'{"id":"c","choices":[{"index":0,"delta":{"content":"ab"},"finish_reason":null}]}',
         b'{"id":"c","choices":[{"index":0,"delta":{"content":"\xff"},"finish_reason":null}]}',
         None),
        (b'{"id":"c","choices":[{"index":0,"delta":{"content":"ab"},"finish_reason":null}]}',
         b'{"id":"c","choices":[{"index":0,"delta":{"content":""},"finish_reason":null}]}',
         None),
        (b'{"id":"c","choices":[{"index":0,"delta":{"content":"ab"},"finish_reason":null}]}',
         b'{"id":"d","choices":[{"index":0,"delta":{"content":"x"},"finish_reason":null}]}',
         None),
        (b'{"id":"c","choices":[{"index":0,"delta":{"content":"ab"},"finish_reason":null}]}',
         b'{"id":"c","choices":[{"index":0,"delta":{"content":"x","y":"z"},"finish_reason":null}]}',
         None),
    ],
    ids=["another-text", "text-equal-to-the-id", "the-text-again-after-it", "escaped-quote", "not-utf8", "empty",
         "other-id", "text-reaching-into-the-tail"],
)  # fmt: skip
def test_text_chunks_take_only_the_learnt_bytes_around_a_plain_text(
    learnt: bytes, payload: bytes, want: tuple[bytes, str] | None
) -> None:
    chunks = TextChunks()
    chunks.learn(learnt, json.loads(learnt), "ab")
    assert chunks.text(payload) == want


@pytest.mark.parametrize("text", ["\x7f", "ab"], ids=["the-probe-itself", "another"])
def test_text_chunks_learn_the_text_not_a_later_string_equal_to_it(text: str) -> None:
    chunks = TextChunks()
    learnt = {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}
    raw = json.dumps({**learnt, "x": text}, separators=(",", ":"), ensure_ascii=False).encode()
    chunks.learn(raw, {**learnt, "x": text}, text)
    assert chunks.text(raw.replace(b'"x":"' + text.encode(), b'"x":"zz')) is None


REQUEST = st.fixed_dictionaries(
    {"model": st.sampled_from(["m", "é/\\"]), "input": st.just("q")},
    optional={
        "instructions": st.text(max_size=6),
        "max_output_tokens": st.integers(1, 99),
        "temperature": st.floats(0, 2),
        "top_p": st.sampled_from([0.5, 1, 0.25]),
        "parallel_tool_calls": st.booleans(),
        "tool_choice": st.sampled_from(["auto", "none", "required", {"type": "function", "name": "f"}]),
        "tools": st.lists(st.fixed_dictionaries({"type": st.just("function"), "name": st.sampled_from(["f", "g\u00e9"])},
                                                optional={"strict": st.booleans(), "description": st.text(max_size=4)}), max_size=2),
        "metadata": st.dictionaries(st.text(max_size=3), st.text(max_size=3), max_size=2),
        "text": st.sampled_from([{"format": {"type": "json_object"}}, {"format": {"type": "text"}},
                                 {"format": {"type": "json_schema", "name": "s", "schema": {"type": "object"}}}]),
    },
)  # fmt: skip
ENDINGS = st.sampled_from([DONE, b"", _data('{"error":{"message":"x","code":"c"}}') + DONE])


@given(REQUEST, STREAM, ENDINGS, st.booleans())
def test_response_objects_are_written_as_the_encoder_writes_them(
    body: dict[str, Any], spec: Any, ending: bytes, store: bool
) -> None:
    """The in-progress and final response objects, written from what the request fixes,
    are the bytes of :func:`final_event` / ``_event`` of the response object."""
    req = parse_responses(body)
    _, stream = _stream(spec)
    t = ChatToResponses(req, "resp_a", 7, store)
    out = t.feed(stream.removesuffix(DONE) + ending) + t.final()
    events = _events(out)
    start = response_object(req, "resp_a", 7, status="in_progress", store=store)
    assert events[0][1] == {"type": "response.created", "sequence_number": 0, "response": start}
    assert out.startswith(_event("response.created", 0, {"response": start}))
    assert t.response is not None and out.endswith(final_event(t.response, t.final_seq))
