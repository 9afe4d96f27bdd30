"""Taking over a dead Transfer Engine's keys (:mod:`services.common.dataplane.metadata`) against
kvmeta's metadata endpoint served in process: deleted when the recorded endpoint refuses
connections or cannot be read, kept when it is alive, nothing to do when absent."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator

import aiohttp
import pytest

from services.common.dataplane.metadata import take_over_dead_segment
from services.kvmeta.metadata_http import MetadataServer

SEG = "127.0.0.1:30100"


@pytest.fixture
async def server() -> AsyncIterator[MetadataServer]:
    srv = MetadataServer("127.0.0.1", 0)
    await srv.start()
    try:
        yield srv
    finally:
        await srv.stop()


def _dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed on return: nothing listens there


@pytest.mark.parametrize(
    ("record", "taken"),
    [("dead", True), ("alive", False), ("garbled", True), (None, False)],
    ids=["dead-owner", "live-owner", "unreadable-record", "no-record"],
)
async def test_take_over_only_a_dead_segment(
    server: MetadataServer, record: str | None, taken: bool
) -> None:
    live = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    live_port = live.sockets[0].getsockname()[1]
    try:
        if record is not None:
            port = live_port if record == "alive" else _dead_port()
            value = json.dumps({"ip_or_host_name": "127.0.0.1", "rpc_port": port}).encode()
            server.store.put(f"mooncake/rpc_meta/{SEG}", b"{" if record == "garbled" else value)
            server.store.put(f"mooncake/ram/{SEG}", b"{}")
        url = f"http://127.0.0.1:{server.bound_port}/metadata"
        async with aiohttp.ClientSession() as http:
            assert await take_over_dead_segment(http, url, SEG) is taken
        left = server.store.get(f"mooncake/rpc_meta/{SEG}") is not None
        assert left == (record is not None and not taken)
        assert (server.store.get(f"mooncake/ram/{SEG}") is not None) == left
    finally:
        live.close()
        await live.wait_closed()
