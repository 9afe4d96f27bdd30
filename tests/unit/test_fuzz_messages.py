"""Property-based tests (hypothesis) of the Anthropic Messages intake: any JSON body (and
near-valid Messages bodies with any block in any place) gives a ParsedRequest or an
``ApiError`` with a 4xx status (rendered in Anthropic's shape by the route), never anything
else; the stream translator takes any bytes."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st

from services.common.apis.anthropic import error_body
from services.common.apis.anthropic_stream import StreamTranslator
from services.common.tokens import TokenPath
from services.scheduler.http.messages import count_tokens
from services.scheduler.http.openai import ApiError, Limits, parse_request

LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 10**6),
    st.floats(allow_nan=False),
    st.text(max_size=8),
)
JSON_VALUES = st.recursive(
    LEAVES,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)),
    max_leaves=10,
)  # fmt: skip
BLOCK_TYPES = st.sampled_from(
    [
        "text",
        "tool_use",
        "tool_result",
        "image",
        "document",
        "thinking",
        "redacted_thinking",
        "x",
        None,
    ]
)
BLOCK_KEYS = st.sampled_from(
    ["text", "id", "name", "input", "tool_use_id", "content", "is_error", "cache_control", "source"]
)
BLOCKS = st.builds(
    lambda t, rest: {"type": t, **rest},
    BLOCK_TYPES,
    st.dictionaries(BLOCK_KEYS, st.one_of(JSON_VALUES, st.text(max_size=5)), max_size=4),
)
CONTENT = st.one_of(st.text(max_size=10), st.lists(BLOCKS, max_size=4), JSON_VALUES)
MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "system", "tool", 3]), "content": CONTENT}
)
TOOL = st.dictionaries(
    st.sampled_from(["name", "description", "input_schema", "type", "cache_control"]),
    st.one_of(JSON_VALUES, st.just({"type": "object"})),
    max_size=4,
)
NEAR_VALID = st.fixed_dictionaries(
    {"model": st.just("m"), "max_tokens": st.one_of(st.integers(-1, 300_000), JSON_VALUES), "messages": st.lists(MESSAGE, max_size=4)},
    optional={
        "system": st.one_of(st.text(max_size=8), st.lists(BLOCKS, max_size=2), JSON_VALUES),
        "tools": st.one_of(st.lists(TOOL, max_size=2), JSON_VALUES),
        "tool_choice": st.one_of(st.fixed_dictionaries({"type": st.sampled_from(["auto", "any", "tool", "none", "x"])}, optional={"name": JSON_VALUES, "disable_parallel_tool_use": JSON_VALUES}), JSON_VALUES),
        "stop_sequences": st.one_of(st.lists(st.text(max_size=4), max_size=2), JSON_VALUES),
        "metadata": st.one_of(st.fixed_dictionaries({"user_id": JSON_VALUES}), JSON_VALUES),
        "stream": JSON_VALUES,
        "temperature": JSON_VALUES,
        "top_k": JSON_VALUES,
        "thinking": JSON_VALUES,
    },
)  # fmt: skip
BODIES = st.one_of(
    NEAR_VALID.map(lambda d: json.dumps(d).encode()),
    JSON_VALUES.map(lambda v: json.dumps(v).encode()),
    st.binary(max_size=40),
)
HEADERS = st.dictionaries(
    st.sampled_from(
        ["X-Tideserve-Session", "X-Tideserve-Session-Final", "x-claude-code-session-id",
         "x-claude-code-agent-id", "x-claude-code-parent-agent-id", "session-id",
         "x-session-id", "x-parent-session-id", "X-Tideserve-Class"]
    ),
    st.text(max_size=8),
    max_size=3,
)  # fmt: skip
LIMITS = Limits(max_prompt_tokens=10_000, max_tokens=200_000)


@given(BODIES, HEADERS)
@example(
    b'{"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": [{"type": "tool_result"}]}]}',
    {},
)
@example(
    b'{"model": "m", "max_tokens": 1, "messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "n", "input": {"a": NaN}}]}]}',
    {},
)
@example(
    b'{"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}], "tools": [{"name": "n", "input_schema": {}}]}',
    {},
)
def test_messages_parser_gives_a_request_or_a_4xx(raw: bytes, headers: dict[str, str]) -> None:
    try:
        p = parse_request("messages", raw, headers, models=(), classes=("agent",), limits=LIMITS)
    except ApiError as exc:
        assert 400 <= exc.status < 500, exc.message
        shaped = error_body(exc.status, exc.message)
        assert shaped["type"] == "error" and shaped["error"]["type"].endswith("error")
        return
    assert p.kind == "messages" and p.prompt_ids and p.native_body is not None
    json.dumps(p.forward_body)  # forwardable


@given(BODIES)
def test_count_tokens_gives_a_count_or_a_4xx(raw: bytes) -> None:
    try:
        n = count_tokens(raw, models=(), limits=LIMITS, tokens=TokenPath())
    except ApiError as exc:
        assert 400 <= exc.status < 500, exc.message
        return
    assert n >= 0


CHUNKS = st.lists(
    st.one_of(
        st.binary(max_size=30),
        JSON_VALUES.map(lambda v: b"data: " + json.dumps(v).encode() + b"\n\n"),
        st.just(b"data: [DONE]\n\n"),
    ),
    max_size=6,
)


@given(CHUNKS)
def test_stream_translator_takes_any_bytes(chunks: list[bytes]) -> None:
    t = StreamTranslator(model="m")
    out = b"".join(t.feed(c) for c in chunks)
    for block in out.decode().split("\n\n"):
        if block:
            name, data = block.split("\n", 1)
            assert name.startswith("event: ")
            evt: Any = json.loads(data.removeprefix("data: "))
            assert evt["type"] == name.removeprefix("event: ")
