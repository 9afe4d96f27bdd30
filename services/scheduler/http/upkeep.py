"""The gateway's background probes of its endpoints (aiohttp I/O into the fleet's state)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

import aiohttp

from services.common import engine_load
from services.common.scheduling.fleet import Fleet
from services.scheduler.http import upstream

__all__ = ["every", "probe_health", "scrape_loads"]


async def probe_health(
    session: aiohttp.ClientSession, fleet: Fleet, timeout_s: float, clock: Callable[[], float]
) -> None:
    """Probe every endpoint's ``/health`` and tell the fleet."""
    ids = fleet.ids()
    oks = await asyncio.gather(
        *(upstream.probe(session, fleet.spec(i).url, timeout_s) for i in ids)
    )
    now = clock()
    for i, ok in zip(ids, oks, strict=True):
        fleet.probe(i, ok, now)


async def scrape_loads(
    session: aiohttp.ClientSession, fleet: Fleet, timeout_s: float, clock: Callable[[], float]
) -> None:
    """Scrape the load of every endpoint due for one, and tell the fleet."""
    before = clock()
    ids = [i for i in fleet.ids() if fleet.needs_scrape(i, before)]
    loads = await asyncio.gather(
        *(engine_load.scrape_load(session, fleet.spec(i).url, timeout_s) for i in ids)
    )
    now = clock()
    for i, ld in zip(ids, loads, strict=True):
        if ld is not None:
            fleet.report_load(i, ld, now)


async def every(period_s: float, fn: Callable[[], Awaitable[None]]) -> None:
    """Run ``fn`` every ``period_s`` until cancelled; a failing run waits for the next."""
    while True:
        with contextlib.suppress(Exception):
            await fn()
        await asyncio.sleep(period_s)
