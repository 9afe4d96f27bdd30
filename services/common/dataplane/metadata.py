"""A Transfer Engine's keys in the metadata server, seen from a process that restarts under
the segment name of one that died (shell).

A process killed with SIGKILL never deletes its keys (``mooncake/rpc_meta/<segment>``: where
its engine listens; ``mooncake/ram/<segment>``: its buffers), and the metadata server
refuses a new engine under a live ``rpc_meta`` key, so a ``kvcache`` instance restarted on
its own name could not start. :func:`take_over_dead_segment` deletes both keys when the
recorded endpoint no longer accepts connections (the owner is dead); a live owner keeps them
(the new engine's start then fails, naming the taken segment).
"""

from __future__ import annotations

import asyncio
import contextlib
import json

import aiohttp

__all__ = ["take_over_dead_segment"]


async def _alive(host: str, port: int, timeout_s: float) -> bool:
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout_s)
    except (OSError, TimeoutError):
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


async def take_over_dead_segment(
    http: aiohttp.ClientSession, metadata_url: str, segment: str, *, timeout_s: float = 1.0
) -> bool:
    """Delete ``segment``'s keys if its recorded Transfer Engine endpoint is dead; True when
    it did. Nothing recorded, or a live endpoint: False (nothing deleted)."""
    async with http.get(metadata_url, params={"key": f"mooncake/rpc_meta/{segment}"}) as resp:
        if resp.status == 404:
            return False
        resp.raise_for_status()
        raw = await resp.read()
    try:
        rec = json.loads(raw)
        host, port = str(rec["ip_or_host_name"]), int(rec["rpc_port"])
    except (ValueError, KeyError, TypeError):
        host, port = "", 0  # unreadable: no endpoint to ask, treat as dead
    if host and port and await _alive(host, port, timeout_s):
        return False
    for kind in ("rpc_meta", "ram"):
        async with http.delete(metadata_url, params={"key": f"mooncake/{kind}/{segment}"}):
            pass
    return True
