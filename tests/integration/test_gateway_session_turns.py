"""Agent-session turns from the gateway to kvmeta, end to end: the gateway wired from
settings (``agent_sessions``, request records on a real Redis), an OpenAI-compatible
upstream answering tool calls, kvmeta's session RPCs written through to a real Postgres.
A turn that ends in a tool call leaves the session idle with its tools, home and chain tip;
a final turn ends it; with kvmeta unreachable, requests are still served and the failed
calls are counted."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import grpc
import pytest
import sqlalchemy as sa
from aiohttp import web
from aiohttp.test_utils import TestServer
from tideserve.v1 import kvmeta_pb2, kvmeta_pb2_grpc

from services.common import db
from services.common.sessions import SessionTable, ToolTimePredictor
from services.kvmeta.sessions import SessionShell, SessionStore
from services.scheduler.compose import build_gateway
from services.scheduler.feeds.integrations import Integrations
from services.scheduler.settings import SchedulerSettings
from tests.helpers.kvmeta import serve_sessions
from tests.helpers.ports import free_port
from tests.helpers.waits import bounded, eventually

pytestmark = pytest.mark.integration

DEP, BS = "dep", 16
USAGE = {"prompt_tokens": 30, "completion_tokens": 9, "total_tokens": 39}


async def fake_model(request: web.Request) -> web.Response:
    """Calls ``read_file`` and ``grep`` when the last message asks for tools, else answers."""
    body = await request.json()
    if "use tools" in body["messages"][-1]["content"]:
        calls = [
            {"id": f"c{i}", "type": "function", "function": {"name": n, "arguments": "{}"}}
            for i, n in enumerate(("read_file", "grep", "read_file"))
        ]
        msg: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": calls}
        finish = "tool_calls"
    else:
        msg, finish = {"role": "assistant", "content": "done"}, "stop"
    choice = {"index": 0, "message": msg, "finish_reason": finish}
    return web.json_response({"object": "chat.completion", "choices": [choice], "usage": USAGE})


@asynccontextmanager
async def kvmeta(pg_url: str) -> AsyncIterator[tuple[str, kvmeta_pb2_grpc.KVMetaServiceStub]]:
    await asyncio.to_thread(db.migrate, pg_url, "kvmeta")
    engine = db.create_engine(pg_url, "kvmeta")
    shell = SessionShell(SessionTable(ToolTimePredictor()), SessionStore(engine), time.time)
    try:
        async with serve_sessions(shell) as served:
            yield served
    finally:
        await engine.dispose()


@asynccontextmanager
async def gateway(kvmeta_address: str, redis_url: str) -> AsyncIterator[tuple[str, Integrations]]:
    up = web.Application()
    up.router.add_post("/v1/chat/completions", fake_model)
    upstream = TestServer(up, host="127.0.0.1")
    await upstream.start_server()
    settings = SchedulerSettings(
        endpoints=[str(upstream.make_url("")).rstrip("/")],
        models=["coder"],
        deployment=DEP,
        block_size=BS,
        redis_url=redis_url,
        stream_prefix=f"t{uuid.uuid4().hex[:8]}",
        kvmeta_address=kvmeta_address,
        agent_sessions=True,
        agent_sessions_deadline_ms=500.0,
        http_port=0,
    )
    core, gw = build_gateway(settings)
    extras = Integrations(settings, core, gw)
    await extras.start()
    srv = TestServer(gw.app(), host="127.0.0.1")
    await srv.start_server()
    try:
        yield str(srv.make_url("")).rstrip("/"), extras
    finally:
        await bounded(srv.close(), "closing the gateway")
        await bounded(extras.stop(), "stopping the integrations")
        await bounded(upstream.close(), "closing the upstream")


async def turn(http: aiohttp.ClientSession, url: str, text: str, **headers: str) -> None:
    body = {"model": "coder", "messages": [{"role": "user", "content": text}], "max_tokens": 8}
    async with http.post(url + "/v1/chat/completions", json=body, headers=headers) as r:
        assert r.status == 200, await r.text()


async def until_phase(
    stub: kvmeta_pb2_grpc.KVMetaServiceStub, sid: str, phase: int, turns: int
) -> kvmeta_pb2.AgentSession:
    got: list[kvmeta_pb2.AgentSession] = []

    async def reached() -> bool:
        try:
            s = (await stub.GetAgentSession(
                kvmeta_pb2.GetAgentSessionRequest(deployment=DEP, session_id=sid), timeout=5
            )).session  # fmt: skip
        except grpc.aio.AioRpcError as e:
            if e.code() == grpc.StatusCode.NOT_FOUND:
                return False
            raise
        got[:] = [s]
        return bool(s.phase == phase and s.turns == turns)

    await eventually(reached, within_s=20.0)
    return got[0]


PROMPT = " ".join(f"w{i}" for i in range(100))  # several full blocks of 16 tokens


async def test_turns_reach_kvmeta_and_postgres(postgres_db_url: str, redis_url: str) -> None:
    async with kvmeta(postgres_db_url) as (address, stub):
        async with gateway(address, redis_url) as (url, extras), aiohttp.ClientSession() as http:
            home = extras.gateway.core.fleet.ids()[0]
            await turn(http, url, PROMPT + " use tools", **{"X-Tideserve-Session": "s1"})
            s = await until_phase(stub, "s1", kvmeta_pb2.SESSION_PHASE_IDLE, 1)
            assert list(s.tool_names) == ["grep", "read_file"]
            assert s.home_instance == home
            assert s.tip_block_hash != 0 and s.tip_tokens > 0 and s.tip_tokens % BS == 0
            assert s.predicted_return_ms > s.last_turn_end_ms
            await turn(
                http,
                url,
                PROMPT + " thanks",
                **{"X-Tideserve-Session": "s1", "X-Tideserve-Session-Final": "1"},
            )
            s = await until_phase(stub, "s1", kvmeta_pb2.SESSION_PHASE_ENDED, 2)
            assert list(s.tool_names) == []
            await turn(http, url, PROMPT)  # no session: no turn
            assert extras.sessions is not None
            stats = extras.sessions.stats
            await eventually(lambda: _true(stats["sent"] == 4))
            assert stats["queued"] == 4 and stats["errors"] == stats["dropped"] == 0
        engine = db.create_engine(postgres_db_url, "kvmeta")
        try:
            async with engine.connect() as conn:
                rows = (await conn.execute(sa.text(
                    "SELECT session_id, phase FROM kvmeta.sessions WHERE deployment = :d"
                ), {"d": DEP})).all()  # fmt: skip
        finally:
            await engine.dispose()
        assert [(r[0], r[1]) for r in rows] == [("s1", "ended")]


async def _true(v: bool) -> bool:
    return v


async def test_kvmeta_down_never_fails_a_request(redis_url: str) -> None:
    async with (
        gateway(f"127.0.0.1:{free_port()}", redis_url) as (url, extras),
        aiohttp.ClientSession() as http,
    ):
        for i in range(3):
            await turn(http, url, PROMPT + f" {i}", **{"X-Tideserve-Session": "s2"})
        assert extras.sessions is not None
        stats = extras.sessions.stats
        await eventually(lambda: _true(stats["errors"] + stats["timeouts"] == 6))
        assert stats["sent"] == 0 and stats["queued"] == 6
