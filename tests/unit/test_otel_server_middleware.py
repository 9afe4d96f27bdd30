"""The gateway's SERVER-span middleware: requests without trace headers under a provider
that records no new traces get a non-recording span of fresh ids (the fast path); the rest
go through the SDK, as before."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased

from services.common import otel
from services.scheduler.core.records import parse_traceparent

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


async def _seen(provider: TracerProvider, headers: Mapping[str, str]) -> dict[str, object]:
    """What a handler behind the middleware sees of its trace context."""

    async def handler(_req: web.Request) -> web.Response:
        trace_id, span_id, sampled = otel.trace_ids()
        out = otel.inject({})
        return web.json_response(
            {
                "trace_id": trace_id,
                "span_id": span_id,
                "sampled": sampled,
                "recording": otel.recording(),
                "traceparent": out.get("traceparent", ""),
            }
        )

    app = web.Application(middlewares=[otel.server_middleware(provider)])
    app.router.add_post("/v1/completions", handler)
    async with TestClient(TestServer(app)) as client:
        resp = await client.post("/v1/completions", headers=dict(headers))
        body: dict[str, object] = await resp.json()
        return body


@pytest.mark.parametrize(
    ("recording_provider", "headers", "recording", "same_trace"),
    [
        (False, {}, False, False),
        (False, {"traceparent": f"00-{TRACE}-00f067aa0ba902b7-00"}, False, True),
        (False, {"traceparent": f"00-{TRACE}-00f067aa0ba902b7-01"}, True, True),
        (False, {"baggage": "gen_ai.conversation.id=s1"}, False, False),
        (True, {}, True, False),
    ],
    ids=["quiet-no-headers", "quiet-unsampled-parent", "quiet-sampled-parent", "quiet-baggage",
         "recording-provider"],
)  # fmt: skip
async def test_trace_context_of_a_request(
    recording_provider: bool,
    headers: dict[str, str],
    recording: bool,
    same_trace: bool,
) -> None:
    provider = (
        otel.add_processors(TracerProvider(sampler=ParentBased(ALWAYS_ON)))
        if recording_provider
        else otel.quiet_provider()
    )
    seen = await _seen(provider, headers)
    # Every request has a valid trace context, propagated to the engines.
    trace_id, span_id = str(seen["trace_id"]), str(seen["span_id"])
    assert len(trace_id) == 32 and len(span_id) == 16 and int(trace_id, 16) and int(span_id, 16)
    assert parse_traceparent(str(seen["traceparent"])) is not None
    assert str(seen["traceparent"]).split("-")[1:3] == [trace_id, span_id]
    assert seen["recording"] is recording
    assert (trace_id == TRACE) is same_trace
