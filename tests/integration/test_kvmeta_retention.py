"""kvmeta's retention controller against the engine simulator over HTTP: sessions whose
turns ended on an engine (their chains sent as the gateway sends them, over gRPC) are
protected there within the budget, the rest offloaded; ``observe`` tells the engine
nothing; an unreachable engine is counted, not fatal; a removed one is not asked again;
an offloaded session is prefetched to its home inside its lead (the engine side is faked
here; tests/integration/test_kvmeta_prefetch.py runs it whole)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from services.common.clock import ManualClock
from services.common.sessions import SessionTable, ToolTimePredictor
from services.common.tokens import block_hashes
from services.engine.server import EngineServer
from services.engine.settings import EngineSettings
from services.kvmeta.rebalance import Rebalancer
from services.kvmeta.retention import RetentionController
from services.kvmeta.sessions import SessionShell
from tests.helpers.ports import free_port
from tests.helpers.waits import bounded

pytestmark = pytest.mark.integration

BS = 16


@pytest.fixture
async def engine(tmp_path: Path) -> AsyncIterator[str]:
    s = EngineSettings(port=0, instance_id="e0", profile="test", speedup=50.0, block_size=BS,
                       kv_blocks=100, state_dir=tmp_path / "e0")  # fmt: skip
    srv = TestServer(EngineServer(s).app(), host="127.0.0.1")
    await srv.start_server()
    try:
        yield str(srv.make_url("")).rstrip("/")
    finally:
        await bounded(srv.close(), "closing the engine")


async def compute(http: aiohttp.ClientSession, url: str, tokens: list[int]) -> list[int]:
    body = {"model": "tideserve-sim", "prompt": tokens, "max_tokens": 1}
    async with http.post(url + "/v1/completions", json=body) as r:
        assert r.status == 200, await r.text()
    return block_hashes(tokens, BS)


@asynccontextmanager
async def ctl_closed(ctl: RetentionController) -> AsyncIterator[None]:
    try:
        yield
    finally:
        await ctl.close()


@pytest.mark.parametrize("eager", [True, False], ids=["eager", "keep-while-room"])
@pytest.mark.parametrize("mode", ["enforce", "observe"])
async def test_protect_within_budget_offload_the_rest(engine: str, mode: str, eager: bool) -> None:
    clock = ManualClock(10_000.0)
    shell = SessionShell(SessionTable(ToolTimePredictor(default_gap_s=30.0)), None, clock.now)
    ctl = RetentionController(
        shell, mode=mode, budget_share=0.2, urls={"e0": engine}, keep_unprotected=not eager
    )
    async with aiohttp.ClientSession() as http, ctl_closed(ctl):
        chains = {}
        for sid, base in (("near", 0), ("far", 1000)):  # 10 blocks each; budget 20 of 100
            chains[sid] = await compute(http, engine, list(range(base, base + 10 * BS)))
        for sid, gap in (("near", 5.0), ("far", 300.0)):
            key = ("d", "t", sid)
            shell.table.turn_start(key, clock.now(), home_instance="e0")
            for _ in range(3):  # the session's own history predicts its gap
                shell.table.turn_end(key, clock.now())
                shell.table.turn_start(key, clock.now() + gap)
            shell.table.turn_end(key, clock.now(), tip_hash=chains[sid][-1])
            shell.set_chain(key, chains[sid])
        # a third session, due back before "far" but too big for the budget beside "near":
        # skipped, and "far" still fits
        chains["big"] = await compute(http, engine, list(range(5000, 5000 + 15 * BS)))
        shell.table.turn_start(("d", "t", "big"), clock.now(), home_instance="e0")
        shell.table.turn_end(("d", "t", "big"), clock.now())
        shell.set_chain(("d", "t", "big"), chains["big"])
        plans = await ctl.tick()
        async with http.get(engine + "/tideserve/retention") as r:
            state = await r.json()
    (plan,) = plans.values()
    assert {k[2] for k in plan.plan.protected} == {"near", "far"}
    # eager: big is offloaded at once; else it stays on the GPU while the engine has room
    assert {k[2] for k in plan.plan.offload} == ({"big"} if eager else set())
    assert {k[2] for k in plan.plan.kept} == (set() if eager else {"big"})
    if mode == "enforce":
        assert state["protected_blocks"] == 20
        assert state["used_blocks"] == (20 if eager else 35)  # big evicted (no tier: freed)
        assert ctl.stats["applied"] == 1
        assert dict(shell.table.get(("d", "t", "near")).tiers) == {1: 10}
        assert dict(shell.table.get(("d", "t", "big")).tiers) == {}
    else:
        assert state["protected_blocks"] == 0 and state["used_blocks"] == 35
        assert ctl.stats["applied"] == 0
    assert ctl.stats["errors"] == 0


async def test_unreachable_engine_is_counted() -> None:
    clock = ManualClock(10_000.0)
    shell = SessionShell(SessionTable(ToolTimePredictor()), None, clock.now)
    iid = f"127.0.0.1:{free_port()}"
    shell.table.turn_start(("d", "t", "s"), clock.now(), home_instance=iid)
    shell.table.turn_end(("d", "t", "s"), clock.now())
    shell.set_chain(("d", "t", "s"), [1, 2])
    shell.table.turn_start(("d", "t", "n"), clock.now(), home_instance="no-port")
    shell.table.turn_end(("d", "t", "n"), clock.now())
    ctl = RetentionController(shell, mode="enforce", timeout_s=1.0)
    async with ctl_closed(ctl):
        assert await ctl.tick() == {}
    assert ctl.stats["errors"] == 1 and ctl.stats["unknown_engine"] == 1


async def test_removed_engine_is_dropped_after_one_error(tmp_path: Path) -> None:
    """An engine told marks, then removed with its sessions re-homed elsewhere: one error,
    then it is no longer asked."""
    clock = ManualClock(10_000.0)
    shell = SessionShell(SessionTable(ToolTimePredictor(default_gap_s=30.0)), None, clock.now)
    s = EngineSettings(port=0, instance_id="e0", profile="test", block_size=BS, kv_blocks=100,
                       state_dir=tmp_path / "e0")  # fmt: skip
    srv = TestServer(EngineServer(s).app(), host="127.0.0.1")
    await srv.start_server()
    url = str(srv.make_url("")).rstrip("/")
    ctl = RetentionController(shell, mode="enforce", urls={"e0": url}, timeout_s=1.0)
    key = ("d", "t", "s")
    async with aiohttp.ClientSession() as http, ctl_closed(ctl):
        chain = await compute(http, url, list(range(10 * BS)))
        shell.table.turn_start(key, clock.now(), home_instance="e0")
        shell.table.turn_end(key, clock.now(), tip_hash=chain[-1])
        shell.set_chain(key, chain)
        await ctl.tick()
        assert ctl.stats["applied"] == 1 and ctl.stats["errors"] == 0
        await bounded(srv.close(), "closing the engine")
        shell.table.set_placement(key, clock.now(), home_instance="gone-elsewhere", tiers={})
        for _ in range(3):
            await ctl.tick()
    assert ctl.stats["errors"] == 1


class FakeEngine:
    """The retention route of an engine with a tier: records POSTs, reports its jobs done
    once told."""

    def __init__(self) -> None:
        self.posts: list[dict[str, Any]] = []
        self.jobs: dict[str, dict[str, Any]] = {}

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/tideserve/retention", self.route)
        return app

    async def route(self, req: web.Request) -> web.Response:
        if req.method == "POST":
            body = await req.json()
            self.posts.append(body)
            for j in body.get("prefetch", []):
                self.jobs[j["id"]] = {"state": "done", "blocks": len(j["hashes"])}
        return web.json_response(
            {"capacity_blocks": 100, "free_blocks": 100, "profile": "test", "block_size": BS,
             "kvcache_tier": True, "offloads_to_tier": True, "prefetches": self.jobs}
        )  # fmt: skip


@pytest.mark.parametrize("mode", ["enforce", "observe"])
async def test_prefetch_is_told_in_enforce_and_counted_in_observe(
    servers: Callable[..., Any], mode: str
) -> None:
    """A session re-homed with its prefix on the tier (as a migration leaves it): inside its
    lead, enforce tells its home to prefetch the chain and settles the job when the engine
    reports it done; observe only counts it."""
    fake = FakeEngine()
    url = await servers(fake.app())
    clock = ManualClock(10_000.0)
    shell = SessionShell(SessionTable(ToolTimePredictor(default_gap_s=30.0)), None, clock.now)
    key = ("d", "t", "s")
    shell.table.turn_start(key, clock.now(), home_instance="e1")
    shell.table.turn_end(key, clock.now(), tip_hash=10)
    shell.set_chain(key, list(range(1, 11)))
    shell.table.set_placement(key, clock.now(), home_instance="e1", tiers={2: 10})
    ctl = RetentionController(shell, mode=mode, urls={"e1": url}, tick_s=0.1)
    async with ctl_closed(ctl):
        await ctl.tick()
        assert ctl.stats["prefetch_planned"] == 0  # 30 s ahead: not yet
        clock.advance(29.8)
        await ctl.tick()
        await ctl.tick()
    started = 1 if mode == "enforce" else 0
    planned = 1 if mode == "enforce" else 2  # observe plans it again each tick
    assert (ctl.stats["prefetch_planned"], ctl.stats["prefetch_started"]) == (planned, started)
    assert ctl.stats["prefetch_finished"] == started
    jobs = [j for p in fake.posts for j in p.get("prefetch", [])]
    if mode == "enforce":
        assert jobs == [{"id": "d/t/s#1", "hashes": list(range(1, 11)), "tenant": "t"}]
        assert dict(shell.table.get(key).tiers) == {1: 10}  # back on the GPU
        assert fake.posts[-1]["protect"] == list(range(1, 11))  # held until the turn
    else:
        assert fake.posts == [] and dict(shell.table.get(key).tiers) == {2: 10}


@pytest.mark.parametrize("mode", ["enforce", "observe"])
async def test_rebalancing_is_told_in_enforce_and_counted_in_observe(
    servers: Callable[..., Any], mode: str
) -> None:
    """Two idle sessions hold 60 of e0's 100 blocks, e1's only session none: enforce tells
    e0 to offload one session's chain and re-homes it on e1 with its prefix on the tier;
    observe counts the move and tells no engine."""
    e0, e1 = FakeEngine(), FakeEngine()
    urls = {"e0": await servers(e0.app()), "e1": await servers(e1.app())}
    clock = ManualClock(10_000.0)
    shell = SessionShell(SessionTable(ToolTimePredictor(default_gap_s=30.0)), None, clock.now)
    chains = {"a": list(range(1, 31)), "b": list(range(100, 130)), "c": []}
    for sid, home in (("a", "e0"), ("b", "e0"), ("c", "e1")):
        key = ("d", "t", sid)
        shell.table.turn_start(key, clock.now(), home_instance=home)
        shell.table.turn_end(key, clock.now(), tip_hash=chains[sid][-1] if chains[sid] else 0)
        if chains[sid]:
            shell.set_chain(key, chains[sid])
    ctl = RetentionController(shell, mode=mode, urls=urls, rebalance=Rebalancer())
    async with ctl_closed(ctl):
        clock.advance(1.0)
        await ctl.tick()
    assert ctl.stats["rebalanced_sessions"] == 1 and ctl.stats["errors"] == 0
    a, b = shell.table.get(("d", "t", "a")), shell.table.get(("d", "t", "b"))
    if mode == "enforce":
        assert e0.posts[-1]["offload"] == list(reversed(chains["a"]))
        assert (a.home_instance, dict(a.tiers)) == ("e1", {2: 30})
    else:
        assert e0.posts == [] and e1.posts == [] and a.home_instance == "e0"
    assert b.home_instance == "e0"
