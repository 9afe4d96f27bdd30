"""What the Messages API adds to records and routing state: Anthropic usage (native
answers, whole and streamed), the parent session and api on the record, and a session's
final turn releasing its routing state (Scheduler.end_session)."""

from __future__ import annotations

import json
import random
from types import SimpleNamespace

import pytest

from services.common.apis.anthropic_stream import StreamTranslator
from services.common.routing.framework import Profile, Scheduler
from services.common.routing.types import Choice, Pick
from services.scheduler.core.records import (
    RequestContext,
    Usage,
    build_record,
    usage_from_body,
    usage_from_sse,
)
from services.scheduler.core.tools import StreamToolCalls, tool_calls_of
from tests.unit._routing_helpers import ep, make, req

MESSAGE = {
    "type": "message",
    "content": [],
    "usage": {"input_tokens": 12, "output_tokens": 3, "cache_read_input_tokens": 8, "cache_creation_input_tokens": 0},
}  # fmt: skip
CHAT_SSE = (
    b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":"length"}],'
    b'"usage":{"prompt_tokens":20,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":8}}}\n\n'
    b"data: [DONE]\n\n"
)


@pytest.mark.parametrize(
    ("data", "want"),
    [
        pytest.param(json.dumps(MESSAGE).encode(), Usage(20, 3, 8), id="message"),
        pytest.param(json.dumps({"usage": {"input_tokens": 5, "output_tokens": 1}}).encode(), Usage(5, 1, 0), id="no-cache-fields"),
        pytest.param(json.dumps({"type": "message_start", "message": MESSAGE}).encode(), Usage(20, 3, 8), id="message_start"),
    ],
)  # fmt: skip
def test_anthropic_usage_of_a_whole_answer(data: bytes, want: Usage) -> None:
    assert usage_from_body(data) == want


def test_anthropic_usage_of_a_stream_is_its_message_delta() -> None:
    stream = StreamTranslator(model="m", input_tokens=20).feed(CHAT_SSE)
    assert b"event: message_delta" in stream
    assert usage_from_sse(stream) == Usage(20, 3, 8)


@pytest.mark.parametrize("keep", [False, True], ids=["sizes", "contents"])
def test_tool_calls_of_a_native_message(keep: bool) -> None:
    msg = {
        "type": "message",
        "content": [
            {"type": "text", "text": "x"},
            {"type": "tool_use", "id": "toolu_1", "name": "read", "input": {"path": "a"}},
        ],
    }
    (call,) = tool_calls_of(msg, keep)
    args = json.dumps({"path": "a"})
    assert (call.id, call.name, call.argument_bytes) == ("toolu_1", "read", len(args))
    assert call.arguments == (args if keep else "")
    assert tool_calls_of({"type": "message", "content": None}) == ()


@pytest.mark.parametrize("keep", [False, True], ids=["sizes", "contents"])
def test_tool_calls_of_a_native_stream_at_every_boundary(keep: bool) -> None:
    chat = (
        b'data: {"id":"c","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_a",'
        b'"function":{"name":"read","arguments":"{\\"path\\": "}}]}}]}\n\n'
        b'data: {"id":"c","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,'
        b'"function":{"arguments":"\\"a\\"}"}}]},"finish_reason":"tool_calls"}]}\n\n'
        b"data: [DONE]\n\n"
    )
    native = StreamTranslator(model="m").feed(chat)  # what an engine serving Messages sends
    for cut in range(0, len(native), 7):
        acc = StreamToolCalls(keep=keep)
        acc.feed(native[:cut])
        acc.feed(native[cut:])
        (call,) = acc.calls()
        assert (call.id, call.name, call.argument_bytes) == ("call_a", "read", len('{"path": "a"}'))
        assert call.arguments == ('{"path": "a"}' if keep else "")


def test_record_carries_api_and_parent_session() -> None:
    parsed = SimpleNamespace(
        model="m", tenant="", slo_class="agent", session_id="agent-7", parent_session_id="cc",
        profile="", kind="messages", prompt_ids=(1, 2, 3), tools_offered=0, tool_results=(),
    )  # fmt: skip
    t = RequestContext(request_id="r", trace_id="t" * 32, arrival=1.0, arrival_wall=1.0)
    t.taken_in("r", parsed, 1.0)  # type: ignore[arg-type]
    rec = build_record(t, status=200, finish=2.0, finish_wall=2.0, deployment="d")
    assert (rec.api, rec.session_id, rec.parent_session_id) == ("messages", "agent-7", "cc")


def test_end_session_drops_the_sticky_instance_of_every_profile() -> None:
    sticky = make("session-affinity")
    other = make("session-affinity", "other")
    profiles = {
        "a": Profile("a", scorers=((sticky, 1.0),), post_pick=(sticky,)),
        "b": Profile("b", scorers=((sticky, 1.0), (other, 1.0)), post_pick=(sticky, other)),
    }
    s = Scheduler(profiles, "a", random.Random(0))
    pick = Pick(decode=Choice(ep("e1"), 0.0), prefill=None, profile="a")
    for plugin in (sticky, other):
        plugin.on_pick(0.0, req(session_id="s1"), pick)
        plugin.on_pick(0.0, req(session_id="s2"), pick)
    assert s.end_session("s1") == 2  # each plugin once, though listed twice
    assert sticky.sticky("s1", 1.0) is None and other.sticky("s1", 1.0) is None
    assert sticky.sticky("s2", 1.0) == "e1"
    assert s.end_session("s1") == 0 and s.end_session("unknown") == 0
