"""What the gateway tells kvmeta of a session's turn (pure builders)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from services.scheduler.core.records import RequestContext
from services.scheduler.core.session_turns import Tip, tip_of, turn_end, turn_start
from services.scheduler.http.openai import parse_request
from tests.helpers.views import request_view

ANSWER_TOOLS = {
    "choices": [
        {
            "message": {
                "role": "assistant",
                "tool_calls": [
                    {"id": "a", "type": "function", "function": {"name": "bash", "arguments": ""}},
                    {"id": "b", "type": "function", "function": {"name": "edit", "arguments": ""}},
                    {"id": "c", "type": "function", "function": {"name": "bash", "arguments": ""}},
                ],
            }
        }
    ]
}
ANSWER_TEXT = {"choices": [{"message": {"role": "assistant", "content": "ok"}}]}


def ctx(headers: dict[str, str], answer: dict[str, Any], cancelled: bool = False) -> RequestContext:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tenant": "acme"}
    p = parse_request("chat", json.dumps(body).encode(), headers, models=(), classes=("agent",))
    t = RequestContext("r", "a" * 32, 1.0, 1000.0)
    t.taken_in("r", p, 1.0)
    t.whole(1.5, json.dumps(answer).encode())
    t.cancelled = cancelled
    return t


S = {"X-Tideserve-Session": "s1"}
FINAL = {**S, "X-Tideserve-Session-Final": "1"}
TIP = Tip(0xABC, 64, (0x123, 0xABC))


@pytest.mark.parametrize(
    ("headers", "answer", "status", "cancelled", "want"),
    [
        (S, ANSWER_TOOLS, 200, False, (0xABC, 64, ["bash", "edit"], False)),
        (S, ANSWER_TEXT, 200, False, (0xABC, 64, [], False)),
        (FINAL, ANSWER_TEXT, 200, False, (0xABC, 64, [], True)),
        (FINAL, ANSWER_TOOLS, 502, False, (0, 0, [], False)),
        (S, ANSWER_TOOLS, 200, True, (0, 0, [], False)),
    ],
    ids=["tool-calls", "answer", "final", "failed-never-final", "cancelled"],
)
def test_turn_end(
    headers: dict[str, str], answer: dict[str, Any], status: int, cancelled: bool, want: Any
) -> None:
    req = turn_end(ctx(headers, answer, cancelled), "dep", status=status, tip=TIP)
    assert req is not None
    assert (req.deployment, req.tenant, req.session_id) == ("dep", "acme", "s1")
    assert (req.tip_block_hash, req.tip_tokens, list(req.tool_names), req.final) == want
    assert list(req.block_hashes) == ([0x123, 0xABC] if want[0] else [])


def test_no_session_is_no_turn() -> None:
    t = ctx({}, ANSWER_TEXT)
    assert turn_start(t, "dep") is None
    assert turn_end(t, "dep", status=200, tip=TIP) is None


def test_turn_start_carries_tenant_and_parent() -> None:
    t = ctx({**S, "X-Tideserve-Parent-Session": "p0"}, ANSWER_TEXT)
    req = turn_start(t, "dep")
    assert req is not None
    assert (req.tenant, req.session_id, req.parent_session_id, req.home_instance) == (
        "acme",
        "s1",
        "p0",
        "",  # not picked yet
    )


@pytest.mark.parametrize(
    ("tokens", "bs", "want_tokens"), [(10, 16, 0), (32, 16, 32), (40, 16, 32)],
    ids=["under-a-block", "whole-blocks", "partial-tail"],
)  # fmt: skip
def test_tip_of(tokens: int, bs: int, want_tokens: int) -> None:
    v = request_view(tokens=list(range(tokens)), block_size=bs, prompt_tokens=tokens)
    tip = tip_of(v)
    assert tip.tokens == want_tokens
    assert tip.chain == v.block_hashes and tip.block_hash == (v.block_hashes or (0,))[-1]
    assert (tip.block_hash != 0) == (want_tokens > 0)


class FakeChannel:
    """A gRPC channel whose calls record (method, session id) or fail with ``fail``."""

    def __init__(self, fail: Exception | None = None) -> None:
        self.calls: list[tuple[str, str]] = []
        self.fail = fail

    def unary_unary(self, method: str, **_: Any) -> Any:
        async def call(req: Any, **_kw: Any) -> Any:
            if self.fail is not None:
                raise self.fail
            self.calls.append((method.rsplit("/", 1)[1], req.session_id))
            return None

        return call


def _ending(status: int = 200) -> Any:
    from services.scheduler.http.records import Ending

    return Ending(status, "", 2.0, 1002.0)


@pytest.mark.parametrize(
    ("buffer", "fail", "want_calls", "want_stats"),
    [
        (10, None, [("StartSessionTurn", "s1"), ("EndSessionTurn", "s1")],
         {"queued": 2, "sent": 2, "dropped": 0, "errors": 0}),
        (1, None, [("StartSessionTurn", "s1")],
         {"queued": 1, "sent": 1, "dropped": 1, "errors": 0}),
        (10, RuntimeError("broken"), [],
         {"queued": 2, "sent": 0, "dropped": 0, "errors": 2}),
    ],
    ids=["in-order", "full-buffer-drops", "errors-counted"],
)  # fmt: skip
async def test_feed_is_bounded_ordered_and_never_raises(
    buffer: int, fail: Exception | None, want_calls: Any, want_stats: dict[str, int]
) -> None:
    from services.scheduler.feeds.session_feed import SessionFeed

    ch = FakeChannel(fail)
    feed = SessionFeed(ch, deployment="dep", buffer=buffer)
    t = ctx(S, ANSWER_TEXT)
    v = request_view(tokens=list(range(32)), block_size=16)
    feed.picked(t, v)
    feed.picked(t, v)  # a retry's pick starts no second turn
    feed.finished(t, _ending())
    await feed.send_queued()
    assert ch.calls == want_calls
    assert {k: feed.stats[k] for k in want_stats} == want_stats
    assert len(feed) == 0
