"""CPU per request of the gateway's tracing, by tracing mode (one process, real sockets).

An in-process gateway (the shipped default profile, one endpoint) in front of a canned
OpenAI-compatible upstream (aiohttp; a 128-token completion answered with usage, or an
8-event SSE stream), driven by a keep-alive aiohttp client in the same process, requests
one after another. Measured: process CPU time per request (client + gateway + upstream: the
client and upstream parts are the same in every mode, so differences are the gateway's).

Modes (a fresh gateway per run; the modes alternate for ``--rounds`` rounds so that noise
from other work on the machine hits each alike; the JSON gives each mode's minimum and
median over the rounds, and the median's difference from ``none``):

- ``none``: ``trace_exporter: none`` (the default): trace context and propagation, nothing
  recorded;
- ``recorded``: every request recorded (GenAI/routing attributes, a gateway SERVER span and
  an upstream CLIENT span) into a ``BatchSpanProcessor`` whose exporter drops the batch —
  what ``trace_exporter: otlp`` costs on the request path, without the network;
- ``sampled_10pct``: ``trace_sample_ratio: 0.1`` with the same processor.

    .venv/bin/python benchmarks/tracing_cost.py --requests 2000 --rounds 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent))

import aiohttp
from _harness import command_line, emit_json, machine
from aiohttp import web
from aiohttp.test_utils import TestServer
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased, TraceIdRatioBased

from services.common import otel
from services.common.scheduling import EndpointSpec, build_core
from services.scheduler.http.options import GatewayOptions
from services.scheduler.http.server import Gateway

MODES = ("none", "recorded", "sampled_10pct")
USAGE = {"prompt_tokens": 128, "completion_tokens": 8, "total_tokens": 136}
WHOLE = json.dumps(
    {"object": "text_completion", "choices": [{"index": 0, "text": "ok"}], "usage": USAGE}
).encode()
SSE = b"".join(
    b'data: {"object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"t"}}]}\n\n'
    for _ in range(7)
) + (b'data: {"choices":[],"usage":%s}\n\ndata: [DONE]\n\n' % json.dumps(USAGE).encode())


class _Drop(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def provider(mode: str) -> TracerProvider:
    if mode == "none":
        return otel.quiet_provider()
    sampler = ParentBased(ALWAYS_ON if mode == "recorded" else TraceIdRatioBased(0.1))
    p = otel.add_processors(TracerProvider(sampler=sampler))
    p.add_span_processor(BatchSpanProcessor(_Drop()))
    return p


async def _completion(req: web.Request) -> web.StreamResponse:
    await req.read()
    return web.Response(body=WHOLE, content_type="application/json")


async def _chat(req: web.Request) -> web.StreamResponse:
    await req.read()
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(req)
    await resp.write(SSE)
    await resp.write_eof()
    return resp


async def run(mode: str, requests: int, stream: bool) -> float:
    """CPU microseconds per request in ``mode``."""
    up = web.Application()
    up.router.add_post("/v1/completions", _completion)
    up.router.add_post("/v1/chat/completions", _chat)
    us = TestServer(up, host="127.0.0.1")
    await us.start_server()
    tp = provider(mode)
    core = build_core([EndpointSpec("e1", str(us.make_url("")).rstrip("/"))])
    gw = Gateway(core, GatewayOptions(background=False, models=("m",)), tracer_provider=tp)
    gs = TestServer(gw.app(), host="127.0.0.1")
    await gs.start_server()
    words = " ".join(f"w{i}" for i in range(128))
    if stream:
        path = "/v1/chat/completions"
        body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": words}]}
        body |= {"stream": True, "max_tokens": 8, "stream_options": {"include_usage": True}}
    else:
        path, body = "/v1/completions", {"model": "m", "prompt": words, "max_tokens": 8}
    url = str(gs.make_url(path))
    headers = {"X-Tideserve-Session": "bench-session"}
    try:
        async with aiohttp.ClientSession() as http:
            for i in range(requests // 10 + requests):
                if i == requests // 10:
                    start = time.process_time()
                async with http.post(url, json=body, headers=headers) as r:
                    await r.read()
                    assert r.status == 200, r.status
            return (time.process_time() - start) / requests * 1e6
    finally:
        await gs.close()
        await us.close()
        tp.shutdown()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=2000, help="measured requests per run")
    ap.add_argument("--rounds", type=int, default=5, help="runs of every mode, alternating")
    ap.add_argument("--out", default=None, help="also write the JSON here")
    args = ap.parse_args()
    results: dict[str, dict[str, list[float]]] = {
        kind: {m: [] for m in MODES} for kind in ("whole", "stream")
    }
    for _ in range(args.rounds):
        for kind in results:
            for mode in MODES:
                us = asyncio.run(run(mode, args.requests, kind == "stream"))
                results[kind][mode].append(round(us, 1))
    summary: dict[str, Any] = {}
    for kind, by_mode in results.items():
        base = statistics.median(by_mode["none"])
        summary[kind] = {
            m: {
                "cpu_us_per_request_min": min(v),
                "cpu_us_per_request_median": statistics.median(v),
                "added_us_vs_none_median": round(statistics.median(v) - base, 1),
                "runs": v,
            }
            for m, v in by_mode.items()
        }
    out = {
        "benchmark": "tracing_cost",
        "command": command_line(),
        "machine": machine(),
        "method": f"{args.requests} sequential requests per run after {args.requests // 10} "
        f"warm-up, {args.rounds} alternating rounds; CPU of the whole process "
        "(client + gateway + upstream)",
        "results": summary,
    }
    emit_json(out, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
