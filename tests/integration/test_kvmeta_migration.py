"""Session migration on scale-in, over gRPC against real Postgres and engine simulators over
HTTP: kvmeta lists the session KV per home instance, then ``MigrateSessions`` re-homes the
victim's live sessions where the router will send them (or to the tier when that home has no
room), drops ended ones, tells the victim engine to offload their blocks, and the new homes
survive a kvmeta restart; the autoscaler's drainer drains, then migrates through it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from tideserve.v1 import kvmeta_pb2, kvmeta_pb2_grpc

from services.autoscaler.drivers.drain import Drainer
from services.autoscaler.drivers.sessions import KVMetaSessions, peers_of
from services.common import db
from services.common.clock import ManualClock
from services.common.planner.driver_base import InstanceState, InstanceStatus, Role
from services.common.sessions import SessionTable, ToolTimePredictor, rendezvous_home
from services.common.sessions.migration import Placement
from services.common.tokens import block_hashes
from services.engine.server import EngineServer
from services.engine.settings import EngineSettings
from services.kvmeta.index import PrefixIndex
from services.kvmeta.ingest import IndexFeeder
from services.kvmeta.migrate import DestinationRef, SessionMigrator
from services.kvmeta.objects import ObjectMaster
from services.kvmeta.servicer import KVMetaServicer, ObjectShell, add_to_server
from services.kvmeta.sessions import SessionShell, SessionStore
from tests.helpers.waits import bounded

pytestmark = pytest.mark.integration

BS = 16
M = kvmeta_pb2


@asynccontextmanager
async def engine(tmp_path: Path, iid: str, kv_blocks: int) -> AsyncIterator[str]:
    s = EngineSettings(port=0, instance_id=iid, profile="test", speedup=50.0, block_size=BS,
                       kv_blocks=kv_blocks, state_dir=tmp_path / iid)  # fmt: skip
    srv = TestServer(EngineServer(s).app(), host="127.0.0.1")
    await srv.start_server()
    try:
        yield str(srv.make_url("")).rstrip("/")
    finally:
        await bounded(srv.close(), f"closing engine {iid}")


@dataclass
class Kv:
    stub: kvmeta_pb2_grpc.KVMetaServiceStub
    shell: SessionShell
    address: str


@asynccontextmanager
async def kvmeta(
    pg_url: str, clock: ManualClock, placement: Placement = "kv_spread"
) -> AsyncIterator[Kv]:
    await asyncio.to_thread(db.migrate, pg_url, "kvmeta")
    dbe = db.create_engine(pg_url, "kvmeta")
    shell = SessionShell(SessionTable(ToolTimePredictor(default_gap_s=30.0)),
                         SessionStore(dbe), clock.now)  # fmt: skip
    await shell.load()
    migrator = SessionMigrator(shell, timeout_s=5.0, placement=placement)
    servicer = KVMetaServicer(IndexFeeder(PrefixIndex(), time.time),
                              ObjectShell(ObjectMaster(), None, clock.now),
                              sessions=shell, migrator=migrator)  # fmt: skip
    server = grpc.aio.server()
    add_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield Kv(kvmeta_pb2_grpc.KVMetaServiceStub(channel), shell, f"127.0.0.1:{port}")
    finally:
        await channel.close()
        await server.stop(None)
        await dbe.dispose()


def sid_homed(home: str, ids: list[str], prefix: str) -> str:
    """A session id whose rendezvous home among ``ids`` is ``home``."""
    return next(f"{prefix}{n}" for n in range(1000) if rendezvous_home(f"{prefix}{n}", ids) == home)


async def used(http: aiohttp.ClientSession, url: str) -> int:
    async with http.get(url + "/tideserve/retention") as r:
        return int((await r.json())["used_blocks"])


async def turn(kv: Kv, http: aiohttp.ClientSession, url: str, tenant: str, sid: str,
               base: int, final: bool = False, home: str = "e0",
               blocks: int = 10) -> None:  # fmt: skip
    """A ``blocks``-block turn of ``sid`` served on ``home`` (at ``url``), reported as the
    gateway reports it."""
    tokens = list(range(base, base + blocks * BS))
    body = {"model": "tideserve-sim", "prompt": tokens, "max_tokens": 1}
    async with http.post(url + "/v1/completions", json=body) as r:
        assert r.status == 200, await r.text()
    k = {"deployment": "d", "tenant": tenant, "session_id": sid}
    await kv.stub.StartSessionTurn(M.StartSessionTurnRequest(**k, home_instance=home))
    chain = block_hashes(tokens, BS)
    await kv.stub.EndSessionTurn(M.EndSessionTurnRequest(
        **k, tip_block_hash=chain[-1], tip_tokens=len(tokens), final=final,
        home_instance=home, block_hashes=chain))  # fmt: skip


async def test_migrate_on_scale_in(postgres_db_url: str, tmp_path: Path) -> None:
    """Rendezvous placement: each live session goes to its rendezvous home among the
    instances that stay, or to the tier when that home lacks room."""
    clock = ManualClock(1_000_000.0)
    ids = ["e1", "e2"]
    to_e1, to_e2 = sid_homed("e1", ids, "a"), sid_homed("e2", ids, "b")
    async with AsyncExitStack() as stack:
        http = await stack.enter_async_context(aiohttp.ClientSession())
        e0 = await stack.enter_async_context(engine(tmp_path, "e0", 100))
        e1 = await stack.enter_async_context(engine(tmp_path, "e1", 100))
        e2 = await stack.enter_async_context(engine(tmp_path, "e2", 8))  # no room for 10
        kv = await stack.enter_async_context(kvmeta(postgres_db_url, clock, "rendezvous"))
        await turn(kv, http, e0, "alice", to_e1, 0)
        await turn(kv, http, e0, "bob", to_e2, 1000)
        await turn(kv, http, e0, "alice", "done", 2000, final=True)
        homes = await kv.stub.ListSessionHomes(M.ListSessionHomesRequest(deployment="d"))
        assert [(h.instance_id, h.sessions, h.blocks, h.tokens) for h in homes.homes] == [
            ("e0", 2, 20, 20 * BS)
        ]
        # both live sessions' turns just ended: active (the ended one is not)
        (h,) = homes.homes
        assert (h.active_sessions, h.active_blocks, h.active_tokens) == (2, 20, 20 * BS)
        assert await used(http, e0) == 30
        got = await kv.stub.MigrateSessions(M.MigrateSessionsRequest(
            deployment="d", instance_id="e0", url=e0,
            destinations=[M.MigrationDestination(instance_id="e1", url=e1, load=1.0),
                          M.MigrationDestination(instance_id="e2", url=e2)]))  # fmt: skip
        fates = {(m.tenant, m.session_id): (m.fate, m.instance_id, m.reason) for m in got.sessions}
        assert fates == {
            ("alice", to_e1): (M.MIGRATION_FATE_MOVE, "e1", ""),
            ("bob", to_e2): (M.MIGRATION_FATE_TIER, "", "no_room"),
            ("alice", "done"): (M.MIGRATION_FATE_DROP, "", "ended"),
        }
        # the live sessions' 20 blocks were offloaded (this engine has no tier: freed)
        assert (got.offload_requested, got.offloaded, got.offloads_to_tier) == (20, 20, False)
        assert (got.engine_detail, got.offload_settled) == ("", False)  # nothing to wait for
        assert await used(http, e0) == 10
        homes = await kv.stub.ListSessionHomes(M.ListSessionHomesRequest(deployment="d"))
        assert {h.instance_id: h.sessions for h in homes.homes} == {"e1": 1, "e2": 1}
        clock.advance(1000.0)  # past the active window and any predicted return
        homes = await kv.stub.ListSessionHomes(M.ListSessionHomesRequest(deployment="d"))
        assert {h.instance_id: (h.sessions, h.active_tokens) for h in homes.homes} == {
            "e1": (1, 0),
            "e2": (1, 0),
        }
    async with kvmeta(postgres_db_url, clock) as kv:  # the new homes were persisted
        for tenant, sid, home in (("alice", to_e1, "e1"), ("bob", to_e2, "e2")):
            req = M.GetAgentSessionRequest(deployment="d", tenant=tenant, session_id=sid)
            s = (await kv.stub.GetAgentSession(req)).session
            assert (s.home_instance, list(s.tiers)) == (home, [])


async def test_kv_spread_places_by_the_destinations_active_kv(
    postgres_db_url: str, tmp_path: Path
) -> None:
    """``kv_spread`` (the default): the victim's sessions go to the instance whose active
    sessions hold the least KV, each move counted before the next, whatever their rendezvous
    homes: here both to e2, since e1 already homes carol's 30-block session."""
    clock = ManualClock(1_000_000.0)
    ids = ["e1", "e2"]
    to_e1, to_e2 = sid_homed("e1", ids, "a"), sid_homed("e2", ids, "b")
    async with AsyncExitStack() as stack:
        http = await stack.enter_async_context(aiohttp.ClientSession())
        e0 = await stack.enter_async_context(engine(tmp_path, "e0", 100))
        e1 = await stack.enter_async_context(engine(tmp_path, "e1", 100))
        e2 = await stack.enter_async_context(engine(tmp_path, "e2", 100))
        kv = await stack.enter_async_context(kvmeta(postgres_db_url, clock))
        await turn(kv, http, e1, "carol", "c", 5000, home="e1", blocks=30)
        await turn(kv, http, e0, "alice", to_e1, 0)
        await turn(kv, http, e0, "bob", to_e2, 1000)
        got = await kv.stub.MigrateSessions(M.MigrateSessionsRequest(
            deployment="d", instance_id="e0", url=e0,
            destinations=[M.MigrationDestination(instance_id="e1", url=e1),
                          M.MigrationDestination(instance_id="e2", url=e2)]))  # fmt: skip
        fates = {m.session_id: (m.fate, m.instance_id) for m in got.sessions}
        assert fates == {to_e1: (M.MIGRATION_FATE_MOVE, "e2"), to_e2: (M.MIGRATION_FATE_MOVE, "e2")}
        assert got.prefetch_started == 0  # these engines have no tier: nothing to fetch from
        homes = await kv.stub.ListSessionHomes(M.ListSessionHomesRequest(deployment="d"))
        assert {h.instance_id: (h.sessions, h.blocks) for h in homes.homes} == {
            "e1": (1, 30),
            "e2": (2, 20),
        }


async def test_unreachable_victim_still_rehomes(postgres_db_url: str, tmp_path: Path) -> None:
    """A victim without the retention route (a real engine, or gone): nothing is offloaded,
    the engine detail says why, and the sessions are still re-homed."""
    clock = ManualClock(1_000_000.0)
    async with AsyncExitStack() as stack:
        http = await stack.enter_async_context(aiohttp.ClientSession())
        e0 = await stack.enter_async_context(engine(tmp_path, "e0", 100))
        kv = await stack.enter_async_context(kvmeta(postgres_db_url, clock))
        await turn(kv, http, e0, "alice", "s", 0)
        got = await kv.stub.MigrateSessions(M.MigrateSessionsRequest(
            deployment="d", instance_id="e0", url="",
            destinations=[M.MigrationDestination(instance_id="e1")]))  # fmt: skip
        assert got.offload_requested == 10 and got.offloaded == 0
        assert "no URL" in got.engine_detail
        s = kv.shell.table.get(("d", "alice", "s"))
        assert s.home_instance == "e1"


@pytest.mark.parametrize(
    ("request_", "call"),
    [
        (M.MigrateSessionsRequest(instance_id="e0"), "MigrateSessions"),
        (M.MigrateSessionsRequest(deployment="d", instance_id="e0",
                                  destinations=[M.MigrationDestination(instance_id="e0")]),
         "MigrateSessions"),
        (M.ListSessionHomesRequest(), "ListSessionHomes"),
    ],
    ids=["no-deployment", "victim-among-destinations", "homes-no-deployment"],
)  # fmt: skip
async def test_migration_rpc_errors(postgres_db_url: str, request_: object, call: str) -> None:
    async with kvmeta(postgres_db_url, ManualClock(1000.0)) as kv:
        rpc: Callable[..., object] = getattr(kv.stub, call)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await rpc(request_)  # type: ignore[misc]
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_drain_then_migrate_through_the_autoscaler_client(
    postgres_db_url: str, tmp_path: Path
) -> None:
    """The autoscaler's side: its drainer (no scheduler to ask; the idle engine is drained at
    once) then asks kvmeta to migrate, naming the victim's READY peers; the planner's view
    of session KV (ListSessionHomes) follows."""
    clock = ManualClock(1_000_000.0)
    async with AsyncExitStack() as stack:
        http = await stack.enter_async_context(aiohttp.ClientSession())
        e0 = await stack.enter_async_context(engine(tmp_path, "e0", 100))
        e1 = await stack.enter_async_context(engine(tmp_path, "e1", 100))
        kv = await stack.enter_async_context(kvmeta(postgres_db_url, clock))
        await turn(kv, http, e0, "alice", "s", 0)
        fleet = [
            InstanceStatus("e0", "d", "worker", Role.WORKER, InstanceState.DRAINING, e0),
            InstanceStatus("e1", "d", "worker", Role.WORKER, InstanceState.READY, e1),
        ]
        client = KVMetaSessions(grpc.aio.insecure_channel(kv.address))
        drainer = Drainer([], timeout_s=10.0, poll_s=0.05, sessions=client)
        try:
            (home,) = (await client.homes("d")).items()
            assert home[0] == "e0" and home[1].blocks == 10
            assert home[1].active_tokens > 0  # its turn just ended: active
            res = await drainer.drain("e0", e0)
            assert res.drained
            line = await drainer.migrate(fleet[0], peers_of(fleet[0], fleet))
            assert line == "sessions: 1 re-homed, 0 to the tier, 0 dropped"
            assert {i: h.blocks for i, h in (await client.homes("d")).items()} == {"e1": 10}
            assert await used(http, e0) == 0
        finally:
            await drainer.close()
            await client.close()


async def test_offload_wait_is_bounded(servers: Callable[..., Any]) -> None:
    """A victim whose stores to the tier never finish: kvmeta answers after its wait with
    ``offload_settled`` false, and the sessions are still re-homed."""
    seen: list[str] = []

    async def route(req: web.Request) -> web.Response:
        seen.append(req.method)
        return web.json_response(
            {"offloaded": 2, "offloads_to_tier": True, "offload_pending": 2, "free_blocks": 0}
        )

    app = web.Application()
    app.router.add_route("*", "/tideserve/retention", route)
    url = await servers(app)
    clock = ManualClock(1000.0)
    shell = SessionShell(SessionTable(), None, clock.now)
    shell.table.turn_start(("d", "t", "s"), clock.now(), home_instance="e0")
    shell.table.turn_end(("d", "t", "s"), clock.now())
    shell.set_chain(("d", "t", "s"), [1, 2])
    migrator = SessionMigrator(shell, offload_wait_s=0.3, poll_s=0.05)
    res = await migrator.migrate("d", "e0", url, [DestinationRef("e1", "http://127.0.0.1:1")])
    assert (res.offloaded, res.offloads_to_tier, res.offload_settled) == (2, True, False)
    assert seen[0] == "POST" and "GET" in seen[1:]  # it polled before giving up
    assert shell.table.get(("d", "t", "s")).home_instance == "e1"
