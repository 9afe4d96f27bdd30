"""Putting blocks on a ``kvcache`` instance's disk segment (client side).

The instance pulls the blocks from this process's Transfer Engine segment, logs them, commits
them in kvmeta and answers (``POST /kvcache/disk/put``, :mod:`services.engine.kvcache_role`);
when :func:`put_on_disk` returns they survive a crash of the instance. Reading them back is an
ordinary :meth:`services.common.dataplane.tier.KVTier.fetch` (kvmeta lists them, tier SSD).
"""

from __future__ import annotations

from collections.abc import Sequence

import aiohttp

from services.common.dataplane.blocks import block_key

__all__ = ["DiskPutError", "put_on_disk"]


class DiskPutError(RuntimeError):
    """The instance refused or failed the put (``status``: its HTTP status)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"disk put failed ({status}): {message}")
        self.status = status


async def put_on_disk(
    http: aiohttp.ClientSession,
    url: str,
    source: str,
    hashes: Sequence[int],
    addrs: Sequence[int],
    size: int,
    *,
    tenant: str = "",
) -> list[int]:
    """Store the ``size``-byte blocks at ``addrs`` of Transfer Engine segment ``source``
    under ``hashes`` on the instance at ``url``; returns their offsets in its segment."""
    body = {
        "tenant": tenant,
        "keys": [block_key(h) for h in hashes],
        "size": size,
        "source": source,
        "addrs": list(addrs),
    }
    async with http.post(url.rstrip("/") + "/kvcache/disk/put", json=body) as resp:
        got = await resp.json(content_type=None)
        if resp.status != 200:
            raise DiskPutError(resp.status, str(got.get("error", {}).get("message", got)))
        return [int(o) for o in got["offsets"]]
