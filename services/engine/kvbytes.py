"""The engine simulator's real KV bytes (shell): one registered arena, cached blocks in it,
and pulls from a peer's arena over the Transfer Engine.

The arena has ``cache_blocks`` slots for cached blocks (slot = :meth:`KVCache.slot_of`; the
shell writes each committed block's deterministic contents, :func:`block_content`) followed
by ``staging_blocks`` slots that receive pulled blocks. A pull reads the blocks a peer lists
in a :class:`KVLocation` into staging slots, verifies every byte against the block hashes the
receiver computed from its own prompt, and gives the slots back; the decode side then runs
from the verified KV (the simulator does not keep pulled blocks in its prefix cache).

A pull never raises: :class:`Pull` says whether it worked and why not (no staging space,
block size mismatch, transfer error, timeout, wrong bytes). After a timeout the staging
slots stay out of use until the native call has returned.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import grpc

from services.common.dataplane.blocks import SlotPool, block_bytes, block_content, mismatched
from services.common.dataplane.location import KVLocation
from services.common.dataplane.settings import DataPlaneSettings
from services.common.dataplane.transfer import (
    Arena,
    DataPlane,
    Transfer,
    TransferError,
    TransferTimeout,
)
from services.engine.settings import EngineSettings

__all__ = ["KVBytes", "Pull", "data_plane_for", "kv_bytes_for"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Pull:
    """The outcome of one pull: ``ok`` and the blocks/bytes moved, wall ``ms`` of the
    transfer (verification excluded), or the ``error`` that sends the request to recompute."""

    ok: bool
    blocks: int = 0
    nbytes: int = 0
    ms: float = 0.0
    error: str = ""


class KVBytes:
    def __init__(
        self,
        plane: DataPlane,
        *,
        cache_blocks: int,
        staging_blocks: int,
        block_bytes: int,
    ) -> None:
        self.plane = plane
        self.cache_blocks = cache_blocks
        self.block_bytes = block_bytes
        self._staging = SlotPool(staging_blocks)
        self.arena: Arena | None = None
        self.pulls_ok = 0
        self.pulls_failed = 0

    async def start(self) -> None:
        await self.plane.start()
        total = (self.cache_blocks + self._staging.capacity) * self.block_bytes
        self.arena = Arena(total)
        await self.plane.register(self.arena)

    async def close(self) -> None:
        await self.plane.close()
        if self.arena is not None:
            self.arena.close()
            self.arena = None

    def addr(self, slot: int) -> int:
        """Address of a cache slot (``0 .. cache_blocks-1``) in the arena."""
        return self._addr(slot)

    def _addr(self, slot: int) -> int:
        assert self.arena is not None
        return self.arena.base + slot * self.block_bytes

    def fill(self, filled: Sequence[tuple[int, int]]) -> None:
        """Write the contents of newly cached blocks ``(hash, slot)``."""
        if self.arena is None:
            return
        for h, slot in filled:
            self.arena.write(slot * self.block_bytes, block_content(h, self.block_bytes))

    def location(self, slots: Sequence[int | None]) -> KVLocation:
        """Where the leading resident blocks of a prompt are (``slots[i]``: block i's slot,
        None = not resident; the list stops at the first None)."""
        addrs: list[int] = []
        for s in slots:
            if s is None:
                break
            addrs.append(self._addr(s))
        return KVLocation(self.plane.segment, self.block_bytes, tuple(addrs))

    async def pull(
        self, loc: KVLocation, hashes: Sequence[int], start: int, timeout_s: float
    ) -> Pull:
        """Pull blocks ``start ..`` of a prompt whose full blocks hash to ``hashes`` from
        ``loc``, verified. Blocks the peer does not list are not pulled (and not counted)."""
        if self.arena is None:
            return self._failed("the data plane is not started")
        if loc.block_bytes != self.block_bytes:
            return self._failed(f"peer blocks are {loc.block_bytes} bytes, ours {self.block_bytes}")
        want = list(hashes[start : len(loc.addrs)])
        remote = list(loc.addrs[start : start + len(want)])

        async def read(local: list[int]) -> Transfer:
            sizes = [self.block_bytes] * len(local)
            return await self.plane.read(loc.segment, local, remote, sizes, timeout_s)

        return await self.receive(want, read)

    async def receive(
        self, want: Sequence[int], read: Callable[[list[int]], Awaitable[Transfer]]
    ) -> Pull:
        """Receive the blocks ``want`` (hashes) into staging slots with ``await read(local
        addresses)``, verify them and give the slots back. Never raises: a failure of
        ``read`` (transfer error, timeout, kvmeta error, missing object) is a failed Pull."""
        if self.arena is None:
            return self._failed("the data plane is not started")
        if not want:
            self.pulls_ok += 1
            return Pull(True)
        slots = self._staging.take(len(want))
        if slots is None:
            return self._failed(f"no staging space for {len(want)} blocks")
        base = self.cache_blocks
        try:
            done = await read([self._addr(base + s) for s in slots])
        except TransferTimeout as err:
            err.pending.add_done_callback(lambda _f: self._staging.give(slots))
            return self._failed(str(err))
        except (TransferError, LookupError, grpc.aio.AioRpcError) as err:
            self._staging.give(slots)
            return self._failed(str(err))
        got = [self.arena.read((base + s) * self.block_bytes, self.block_bytes) for s in slots]
        self._staging.give(slots)
        bad = mismatched(want, got)
        if bad:
            return self._failed(f"{len(bad)} of {len(want)} received blocks have wrong bytes")
        self.pulls_ok += 1
        return Pull(True, len(want), done.nbytes, done.ms)

    def _failed(self, error: str) -> Pull:
        self.pulls_failed += 1
        log.warning("KV pull failed, recomputing: %s", error)
        return Pull(False, error=error)


def kv_bytes_for(settings: EngineSettings, cache_blocks: int, per_token: int) -> KVBytes | None:
    """The engine's real KV bytes when ``kv_data_plane`` is on (the native library loads
    here: ``DataPlaneUnavailable`` names what to install)."""
    if not (settings.kv_data_plane or settings.kvcache_tier):
        return None
    return KVBytes(
        data_plane_for(settings),
        cache_blocks=cache_blocks,
        staging_blocks=settings.kv_staging_blocks or cache_blocks,
        block_bytes=block_bytes(per_token, settings.block_size, settings.kv_bytes_scale),
    )


def data_plane_for(settings: EngineSettings) -> DataPlane:
    """The engine's data plane (not started); segment name ``te_hostname``, else
    ``host:<HTTP port>`` (a free port's number when the HTTP port is 0)."""
    name = settings.te_hostname or f"{settings.host}:{settings.port or _free_port(settings.host)}"
    return DataPlane(
        DataPlaneSettings(
            hostname=name,
            metadata_url=settings.te_metadata_url,
            protocol=settings.te_protocol,
            device=settings.te_device,
            transfer_timeout_s=settings.kv_transfer_timeout_s,
        )
    )


def _free_port(host: str) -> int:
    """A port free on ``host`` now: a unique segment name for an engine on port 0."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
