"""The gateway span's GenAI and routing attributes (pure)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from services.common.routing.types import Choice, EndpointView, Pick
from services.scheduler.core.genai import span_attributes
from services.scheduler.core.records import RequestContext
from services.scheduler.http.openai import parse_request

USAGE = {"prompt_tokens": 100, "completion_tokens": 11, "prompt_tokens_details": {"cached_tokens": 64}}  # fmt: skip
PICK = Pick(
    decode=Choice(
        EndpointView("d1"),
        2.5,
        (("ttft", 0.5, 4.0), ("load", 0.9, 1.0), ("prefix", 0.1, 1.0), ("session", 1.0, 0.5)),
    ),
    prefill=Choice(EndpointView("p1"), 1.0, (("ttft", 1.0, 4.0),)),
    profile="pd",
    predicted_cached_tokens=64,
    predicted_ttft_ms=12.5,
)


def context(*, stream: bool, session: str = "", tools: bool = False) -> RequestContext:
    body: dict[str, Any] = {
        "model": "llama",
        "messages": [{"role": "user", "content": "hi there"}],
        "stream": stream,
    }
    if tools:
        body["tools"] = [{"type": "function", "function": {"name": "f"}}]
    headers = {"X-Tideserve-Session": session} if session else {}
    p = parse_request("chat", json.dumps(body).encode(), headers, models=(), classes=("agent",))
    t = RequestContext("r1", "a" * 32, 10.0, 1000.0, path="/v1/chat/completions")
    t.taken_in("r1", p, 10.0)
    t.admitted(10.002)
    t.picked(PICK, 1)
    if stream:
        t.answering(10.1, True)
        t.chunk(f"data: {json.dumps({'choices': [], 'usage': USAGE})}\n\ndata: [DONE]\n\n".encode())
    else:
        t.whole(10.1, json.dumps({"choices": [], "usage": USAGE}).encode())
    return t


@pytest.mark.parametrize(
    ("stream", "status", "present", "absent"),
    [
        (
            True,
            200,
            {
                "gen_ai.server.time_to_first_token": pytest.approx(0.1),
                "gen_ai.server.time_per_output_token": pytest.approx(0.05),  # 0.5 s / 10
            },
            (),
        ),
        (False, 200, {"gen_ai.server.time_to_first_token": pytest.approx(0.1)}, ("gen_ai.server.time_per_output_token",)),
        (True, 502, {}, ("gen_ai.server.time_to_first_token", "gen_ai.server.time_per_output_token")),
    ],
    ids=["streamed", "whole", "failed"],
)  # fmt: skip
def test_timings(
    stream: bool, status: int, present: dict[str, Any], absent: tuple[str, ...]
) -> None:
    a = span_attributes(context(stream=stream), status=status, finish=10.6)
    for key, value in present.items():
        assert a[key] == value, key
    for key in absent:
        assert key not in a


def test_genai_and_routing_attributes() -> None:
    a = span_attributes(context(stream=True, session="s-1", tools=True), status=200, finish=10.6)
    assert {k: v for k, v in a.items() if k.startswith("gen_ai.") and "time" not in k} == {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": "llama",
        "gen_ai.conversation.id": "s-1",
        "gen_ai.usage.input_tokens": 100,
        "gen_ai.usage.output_tokens": 11,
        "gen_ai.usage.cache_read.input_tokens": 64,
    }
    assert a["tideserve.request_id"] == "r1"
    assert a["tideserve.slo_class"] == "" and a["tideserve.tenant"] == ""
    assert (a["tideserve.profile"], a["tideserve.decode_instance"]) == ("pd", "d1")
    assert (a["tideserve.prefill_instance"], a["tideserve.disaggregated"]) == ("p1", True)
    assert (a["tideserve.predicted_cached_tokens"], a["tideserve.predicted_ttft_ms"]) == (64, 12.5)
    assert a["tideserve.retries"] == 1 and a["tideserve.queue_ms"] == pytest.approx(2.0)
    assert a["tideserve.tools_offered"] == 1
    # The three plugins that weighed most (score x weight): ttft 2.0, load 0.9, session 0.5.
    scores = {k: v for k, v in a.items() if k.startswith("tideserve.score.")}
    assert scores == {
        "tideserve.score.ttft": 0.5,
        "tideserve.score.load": 0.9,
        "tideserve.score.session": 1.0,
    }


def test_no_session_no_conversation_id() -> None:
    a = span_attributes(context(stream=False), status=200, finish=10.2)
    assert "gen_ai.conversation.id" not in a and "tideserve.tools_offered" not in a
