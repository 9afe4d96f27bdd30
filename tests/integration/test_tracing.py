"""One request, one trace: the gateway, kvmeta and a simulated engine in this process (real
Redis for the engines' KV events, in-process servers on 127.0.0.1), one tracer provider
with an in-memory exporter. A streamed chat request of an agent session through the
gateway gives, under the caller's trace id:

    gateway SERVER span (POST /v1/chat/completions)
    ├── kvmeta MatchPrefix CLIENT span ── kvmeta MatchPrefix SERVER span
    └── upstream CLIENT span (POST)    ── engine SERVER span (POST /v1/chat/completions)

with the GenAI attributes on the gateway span and ``gen_ai.conversation.id`` on all five.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
import redis.asyncio as aioredis
from aiohttp.test_utils import TestServer
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from services.common import otel
from services.common.scheduling import EndpointSpec, build_core
from services.common.security import channels
from services.common.tokens import TokenPath, block_hashes
from services.engine.server import EngineServer
from services.engine.settings import EngineSettings
from services.kvmeta.index import PrefixIndex
from services.kvmeta.ingest import IndexFeeder
from services.kvmeta.objects import ObjectMaster
from services.kvmeta.servicer import KVMetaServicer, ObjectShell, add_to_server
from services.scheduler.feeds.kvmeta_client import KVMetaLookup, precise_profiles
from services.scheduler.http.options import GatewayOptions
from services.scheduler.http.server import Gateway
from tests.helpers.waits import eventually

pytestmark = pytest.mark.integration

BS = 16
DEP = "llama"
SESSION = "agent-7"
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SHARED = " ".join(f"doc{i}" for i in range(200))  # the chat template adds a role prefix
MATCH = "/tideserve.v1.KVMetaService/MatchPrefix"


@dataclass
class Stack:
    url: str
    engine_url: str
    feeder: IndexFeeder
    spans: InMemorySpanExporter


@pytest.fixture
async def stack(tmp_path: Path, redis_url: str) -> AsyncIterator[Stack]:
    exporter = InMemorySpanExporter()
    provider = otel.add_processors(TracerProvider())
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    prefix = f"t{uuid.uuid4().hex[:8]}"
    redis = aioredis.Redis.from_url(redis_url, decode_responses=False)
    settings = EngineSettings(
        port=0,
        instance_id="e0",
        profile="test",
        speedup=50.0,
        block_size=BS,
        redis_url=redis_url,
        deployment=DEP,
        stream_prefix=prefix,
        kv_flush_ms=10.0,
        state_dir=tmp_path / "e0",
    )
    engine = TestServer(
        EngineServer(settings, redis=redis, tracer_provider=provider).app(), host="127.0.0.1"
    )
    await engine.start_server()
    engine_url = str(engine.make_url("")).rstrip("/")
    feeder = IndexFeeder(
        PrefixIndex(),
        time.time,
        redis=redis,
        prefix=prefix,
        checkpoint_interval_s=0,
        discover_interval_s=0.1,
        block_ms=50,
    )
    await feeder.start()
    kvmeta = grpc.aio.server(interceptors=[otel.server_interceptor(provider)])
    add_to_server(KVMetaServicer(feeder, ObjectShell(ObjectMaster(), None, time.time)), kvmeta)
    port = kvmeta.add_insecure_port("127.0.0.1:0")
    await kvmeta.start()
    channel = channels.insecure_channel(f"127.0.0.1:{port}", provider)
    core = build_core([EndpointSpec("e0", engine_url)], perf_profile="test", block_size=BS)
    lookup = KVMetaLookup(
        channel,
        candidates=core.fleet.ids,
        profiles=precise_profiles(core.scheduler),
        deadline_s=2.0,
    )
    gw = Gateway(
        core,
        GatewayOptions(background=False, block_size=BS, deployment=DEP),
        prefix_lookup=lookup,
        tracer_provider=provider,
    )
    gateway = TestServer(gw.app(), host="127.0.0.1")
    await gateway.start_server()
    try:
        await gw.poll_load()
        url = str(gateway.make_url("")).rstrip("/")
        yield Stack(url, engine_url, feeder, exporter)
    finally:
        await gateway.close()
        await channel.close()
        await kvmeta.stop(None)
        await feeder.stop(checkpoint=False)
        await engine.close()
        await redis.aclose()
        provider.shutdown()


def chat(content: str) -> dict[str, Any]:
    return {
        "model": "tideserve-sim",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 6,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


async def warm_prefix(stack: Stack, http: aiohttp.ClientSession) -> None:
    """The engine computes the shared prompt; kvmeta indexes its blocks (so the traced
    request is a prefix hit found through MatchPrefix)."""
    async with http.post(stack.engine_url + "/v1/chat/completions", json=chat(SHARED)) as r:
        assert r.status == 200
        await r.read()
    ids = TokenPath().encode_chat(chat(SHARED)["messages"])
    hashes = block_hashes(ids, BS)[:8]

    async def indexed() -> bool:
        if DEP not in stack.feeder.block_sizes:
            return False
        got = stack.feeder.index.match_prefix(DEP, "", hashes, ["e0"])
        return bool(got) and got[0].matched_blocks >= 8

    await eventually(indexed)


def one(spans: list[ReadableSpan], name: str, kind: SpanKind) -> ReadableSpan:
    found = [s for s in spans if s.name == name and s.kind == kind]
    assert len(found) == 1, f"{name} {kind}: {[(s.name, s.kind) for s in spans]}"
    return found[0]


def parent_of(span: ReadableSpan) -> int:
    assert span.parent is not None, f"{span.name} has no parent"
    return span.parent.span_id


def span_id(span: ReadableSpan) -> int:
    assert span.context is not None
    return span.context.span_id


async def test_one_request_is_one_trace_across_gateway_kvmeta_and_engine(stack: Stack) -> None:
    async with aiohttp.ClientSession() as http:
        await warm_prefix(stack, http)
        stack.spans.clear()
        headers = {
            "traceparent": f"00-{TRACE}-00f067aa0ba902b7-01",
            "X-Tideserve-Session": SESSION,
        }
        body = chat(SHARED + " and one more question")
        async with http.post(stack.url + "/v1/chat/completions", json=body, headers=headers) as r:
            assert r.status == 200
            text = await r.text()
    assert text.rstrip().endswith("data: [DONE]")

    def traced() -> list[ReadableSpan]:
        return [
            s
            for s in stack.spans.get_finished_spans()
            if s.context is not None and s.context.trace_id == int(TRACE, 16)
        ]

    async def five() -> bool:
        return len(traced()) >= 5

    await eventually(five)  # the engine's span may end after the gateway's
    spans = traced()
    assert len(spans) == 5, [(s.name, s.kind) for s in spans]
    servers = [s for s in spans if s.name == "POST /v1/chat/completions"]
    gateway = next(s for s in servers if parent_of(s) == 0x00F067AA0BA902B7)
    engine = next(s for s in servers if s is not gateway)
    lookup = one(spans, MATCH, SpanKind.CLIENT)
    indexer = one(spans, MATCH, SpanKind.SERVER)
    upstream = one(spans, "POST", SpanKind.CLIENT)
    assert (gateway.kind, engine.kind) == (SpanKind.SERVER, SpanKind.SERVER)
    assert parent_of(lookup) == span_id(gateway)
    assert parent_of(indexer) == span_id(lookup)
    assert parent_of(upstream) == span_id(gateway)
    assert parent_of(engine) == span_id(upstream)

    for s in spans:
        assert s.attributes is not None
        assert s.attributes.get("gen_ai.conversation.id") == SESSION, s.name
    a = gateway.attributes
    assert a is not None
    assert a["gen_ai.operation.name"] == "chat"
    assert a["gen_ai.request.model"] == "tideserve-sim"
    assert a["gen_ai.usage.output_tokens"] == 6
    assert a["gen_ai.usage.input_tokens"] > a["gen_ai.usage.cache_read.input_tokens"] > 0
    assert a["gen_ai.server.time_to_first_token"] > 0
    assert a["gen_ai.server.time_per_output_token"] > 0
    assert a["tideserve.decode_instance"] == "e0"
    assert a["tideserve.predicted_cached_tokens"] > 0  # kvmeta's answer reached routing
    assert a["http.status_code"] == 200
