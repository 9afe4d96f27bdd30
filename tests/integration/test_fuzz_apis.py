"""The gateway's HTTP API and the scheduler's and kvmeta's gRPC APIs fed malformed input (hypothesis):
no crash, no hang, no 5xx / INTERNAL for a client's mistake, and every HTTP error is an
OpenAI-style body (Anthropic-style on the Messages routes).

The gateway (over two in-process simulated engines) and the gRPC servicer run on an event
loop in a background thread; the property tests are synchronous clients with timeouts, so a
hang fails them instead of blocking the suite."""

from __future__ import annotations

import asyncio
import http.client
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from aiohttp.test_utils import TestServer
from hypothesis import example, given
from hypothesis import strategies as st
from tideserve.v1 import events_pb2, kvmeta_pb2, kvmeta_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc

from services.common.scheduling import EndpointSpec, build_core
from services.kvmeta.index import PrefixIndex
from services.kvmeta.ingest import IndexFeeder
from services.kvmeta.objects import ObjectMaster
from services.kvmeta.servicer import KVMetaServicer, ObjectShell
from services.kvmeta.servicer import add_to_server as add_kvmeta
from services.scheduler.grpc.servicer import SchedulerServicer, add_to_server
from services.scheduler.http.options import GatewayOptions
from services.scheduler.http.server import Gateway
from tests.helpers.engines import EngineFleet

pytestmark = pytest.mark.integration

CLIENT_MISTAKE_CODES = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.OUT_OF_RANGE,
    grpc.StatusCode.UNAVAILABLE,  # no routable endpoint: a retryable answer
}


class Served:
    """The gateway and the gRPC servicer, on a loop in a thread."""

    def __init__(self, root: Path) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.root = root
        self.http_port, self.grpc_port = self.call(self._start())

    def call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=120)

    async def _start(self) -> tuple[int, int]:
        self.fleet = EngineFleet(self.root, profile="test", speedup=50.0)
        specs = []
        for i in range(2):
            _, url = await self.fleet.start()
            specs.append(EndpointSpec(f"e{i}", url, deployment="d"))
        core = build_core(specs, perf_profile="test", block_size=16)
        gw = Gateway(core, GatewayOptions(background=False, block_size=16, backoff_ms=1))
        self.server = TestServer(gw.app(), host="127.0.0.1")
        await self.server.start_server()
        await gw.poll_load()
        self.grpc_server = grpc.aio.server()
        add_to_server(SchedulerServicer(core, deployment="d", block_size=16), self.grpc_server)
        feeder = IndexFeeder(PrefixIndex(), time.time)  # no Redis, no Postgres: in memory
        objects = ObjectShell(ObjectMaster(), None, time.time)
        add_kvmeta(KVMetaServicer(feeder, objects, max_match_blocks=64), self.grpc_server)
        grpc_port = self.grpc_server.add_insecure_port("127.0.0.1:0")
        await self.grpc_server.start()
        assert self.server.port is not None
        return self.server.port, grpc_port

    async def _stop(self) -> None:
        await self.grpc_server.stop(None)
        await self.server.close()
        await self.fleet.close()

    def close(self) -> None:
        self.call(self._stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=30)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    s = Served(tmp_path_factory.mktemp("fuzz-apis"))
    yield s
    s.close()


JSON = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False),
              st.text(max_size=12)),
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.text(max_size=8), inner, max_size=3)),
    max_leaves=10,
)  # fmt: skip
FIELDS = st.sampled_from(
    ["model", "prompt", "messages", "max_tokens", "stream", "stream_options", "n", "tools",
     "slo_class", "tenant", "session_id", "cache_salt", "temperature", "stop", "text",
     "input_ids", "max_completion_tokens", "logprobs", "tool_choice"]
)  # fmt: skip
NEAR_VALID = st.fixed_dictionaries(
    {"model": st.sampled_from(["tideserve-sim", "", "other"])},
    optional={
        "prompt": st.one_of(st.text(max_size=30), st.lists(st.integers(-5, 2**33), max_size=5), JSON),
        "messages": st.one_of(
            st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "tool", "x"])},
                                            optional={"content": JSON}), max_size=3),
            JSON,
        ),
        "max_tokens": st.one_of(st.integers(-5, 2**40), st.floats(), st.text(max_size=3)),
        "stream": st.one_of(st.booleans(), JSON),
    },
).flatmap(lambda d: st.dictionaries(FIELDS, JSON, max_size=3).map(lambda extra: {**extra, **d}))  # fmt: skip
BODIES = st.one_of(
    NEAR_VALID.map(lambda d: json.dumps(d).encode()),
    st.dictionaries(FIELDS, JSON, max_size=5).map(lambda d: json.dumps(d).encode()),
    st.binary(max_size=60),
)
HEADERS = st.dictionaries(
    st.sampled_from(["X-Tideserve-Class", "X-Tideserve-Tenant", "X-Tideserve-Session",
                     "X-Tideserve-Deadline-Ms", "X-Tideserve-Profile", "traceparent",
                     "Content-Type"]),
    st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=16),
    max_size=3,
)  # fmt: skip
PATHS = st.sampled_from(["/v1/chat/completions", "/v1/completions", "/generate"])


@given(PATHS, BODIES, HEADERS)
@example(
    "/v1/completions", b'{"model": "tideserve-sim", "prompt": "a\\u0000b", "max_tokens": 2}', {}
)
@example("/v1/chat/completions", b'{"model": "tideserve-sim", "messages": [{"role": "user"}]}', {})
@example("/v1/completions", b'{"model": "tideserve-sim", "prompt": "x", "max_tokens": 1e999}', {})
def test_http_api_answers_malformed_input_with_a_4xx_error_body(
    served: Served, path: str, body: bytes, headers: dict[str, str]
) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", served.http_port, timeout=60)
    try:
        conn.request("POST", path, body=body, headers=headers)
        resp = conn.getresponse()
        text = resp.read().decode("utf-8", "replace")
    finally:
        conn.close()
    assert resp.status < 500, (resp.status, text)
    if resp.status >= 400:
        err = json.loads(text)["error"]
        assert isinstance(err["message"], str) and err["message"], text


UINT32 = st.integers(0, 2**32 - 1)
INT32 = st.integers(-(2**31), 2**31 - 1)
PICKS = st.builds(
    scheduler_pb2.PickRequest,
    deployment=st.sampled_from(["d", "", "nope"]),
    prompt_token_ids=st.lists(UINT32, max_size=40),
    prompt_text=st.text(max_size=60),
    block_hashes=st.lists(st.integers(0, 2**64 - 1), max_size=8),
    prompt_tokens=INT32,
    max_tokens=INT32,
    tenant=st.text(max_size=6),
    slo_class=st.one_of(st.sampled_from(["", "interactive", "batch"]), st.text(max_size=6)),
    session_id=st.text(max_size=6),
    profile=st.one_of(st.just(""), st.text(max_size=6)),
    deadline_ms=st.integers(-(2**63), 2**63 - 1),
    exclude_instances=st.lists(st.sampled_from(["e0", "e1", "x"]), max_size=3),
    traceparent=st.text(max_size=60),
    tag=st.text(max_size=6),
)


@given(PICKS)
def test_grpc_pick_never_fails_internally_or_hangs(served: Served, req: Any) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{served.grpc_port}") as channel:
        stub = scheduler_pb2_grpc.SchedulerServiceStub(channel)
        try:
            resp = stub.Pick(req, timeout=60)
        except grpc.RpcError as exc:
            assert exc.code() in CLIENT_MISTAKE_CODES, (exc.code(), exc.details())
            assert exc.details(), exc.code()
            return
        if resp.pick_id:  # release what the pick holds
            stub.ReportOutcome(scheduler_pb2.ReportOutcomeRequest(pick_id=resp.pick_id), timeout=60)


def _check_rpc(call: Any) -> None:
    try:
        call()
    except grpc.RpcError as exc:
        assert exc.code() in CLIENT_MISTAKE_CODES, (exc.code(), exc.details())
        assert exc.details(), exc.code()


TEXT = st.text(max_size=8)
EVENTS = st.builds(
    events_pb2.KVEvent,
    kind=st.integers(0, 5),
    tier=st.integers(0, 6),
    block_hashes=st.lists(st.integers(0, 2**64 - 1), max_size=6),
    tenant=TEXT,
    lora=TEXT,
)
BATCHES = st.builds(
    events_pb2.KVEventBatch,
    deployment=st.sampled_from(["d", "", "x"]),
    instance_id=st.sampled_from(["i1", "", "i2"]),
    epoch=st.integers(-(2**63), 2**63 - 1),
    seq=st.integers(-(2**63), 2**63 - 1),
    events=st.lists(EVENTS, max_size=4),
    block_size=INT32,
)


@given(
    st.lists(BATCHES, max_size=4),
    st.builds(
        kvmeta_pb2.MatchPrefixRequest,
        deployment=st.sampled_from(["d", "", "x"]),
        tenant=TEXT,
        block_hashes=st.lists(st.integers(0, 2**64 - 1), max_size=80),
        candidate_instances=st.lists(TEXT, max_size=3),
        lora=TEXT,
    ),
)
def test_kvmeta_ingest_and_match_never_fail_internally(
    served: Served, batches: list[Any], match: Any
) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{served.grpc_port}") as channel:
        stub = kvmeta_pb2_grpc.KVMetaServiceStub(channel)
        _check_rpc(lambda: stub.IngestEvents(iter(batches), timeout=60))
        _check_rpc(lambda: stub.MatchPrefix(match, timeout=60))


BLOCK = st.fixed_dictionaries(
    {"type": st.sampled_from(["text", "tool_use", "tool_result", "image", "thinking", "x"])},
    optional={
        "text": st.one_of(st.text(max_size=12), JSON),
        "id": st.one_of(st.just("t1"), JSON),
        "name": st.one_of(st.just("read"), JSON),
        "input": st.one_of(st.just({}), JSON),
        "tool_use_id": st.one_of(st.just("t1"), JSON),
        "content": st.one_of(st.text(max_size=12), JSON),
        "is_error": JSON,
        "cache_control": JSON,
    },
)
ANTHROPIC_MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "system"])},
    optional={"content": st.one_of(st.text(max_size=20), st.lists(BLOCK, max_size=3), JSON)},
)
MESSAGES_BODIES = st.one_of(
    st.fixed_dictionaries(
        {"model": st.sampled_from(["tideserve-sim", "", "other"])},
        optional={
            "max_tokens": st.one_of(st.integers(-2, 6), JSON),
            "messages": st.one_of(st.lists(ANTHROPIC_MESSAGE, max_size=3), JSON),
            "system": st.one_of(st.text(max_size=10), st.lists(BLOCK, max_size=2), JSON),
            "tools": st.one_of(st.lists(st.dictionaries(st.sampled_from(["name", "input_schema", "type"]), JSON, max_size=3), max_size=2), JSON),
            "tool_choice": JSON,
            "stop_sequences": JSON,
            "metadata": JSON,
            "stream": st.one_of(st.booleans(), JSON),
        },
    ).map(lambda d: json.dumps(d).encode()),
    st.binary(max_size=60),
)  # fmt: skip
MESSAGES_HEADERS = st.dictionaries(
    st.sampled_from(["x-claude-code-session-id", "x-claude-code-agent-id", "session-id",
                     "X-Tideserve-Session-Final", "X-Tideserve-Class", "anthropic-version"]),
    st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=16),
    max_size=3,
)  # fmt: skip


@given(
    st.sampled_from(["/v1/messages", "/v1/messages/count_tokens"]),
    MESSAGES_BODIES,
    MESSAGES_HEADERS,
)
@example(
    "/v1/messages",
    b'{"model": "tideserve-sim", "max_tokens": 2, "messages": [{"role": "user", "content": [{"type": "tool_result"}]}]}',
    {},
)
@example(
    "/v1/messages",
    b'{"model": "tideserve-sim", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}], "stream": true}',
    {"X-Tideserve-Session-Final": "1"},
)
def test_messages_api_answers_with_a_message_or_an_anthropic_4xx(
    served: Served, path: str, body: bytes, headers: dict[str, str]
) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", served.http_port, timeout=60)
    try:
        conn.request("POST", path, body=body, headers=headers)
        resp = conn.getresponse()
        text = resp.read().decode("utf-8", "replace")
    finally:
        conn.close()
    assert resp.status < 500, (resp.status, text)
    if resp.status >= 400:
        got = json.loads(text)
        assert got["type"] == "error" and got["error"]["type"].endswith("error"), text
        assert isinstance(got["error"]["message"], str) and got["error"]["message"], text
