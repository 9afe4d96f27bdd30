"""An engine and the KV-cache tier (shell; ``--kvcache-tier``, needs ``--kv-data-plane``).

What is stored depends on ``--kvcache-policy``:

- ``write_through``: every block the engine commits is stored in the tier (``kvcache``
  instances mounted in kvmeta);
- ``offload_on_evict``: only the blocks the engine evicts. The cache holds an evicted block's
  slot (its bytes) until :meth:`KVCache.offloaded` (:mod:`services.common.engine_core.kvcache`), called
  when the store is done or failed, so the store reads the right bytes; an admission that
  needs those blocks waits for it (``on_freed`` wakes the engine's stepping loop).

Either way a block kvmeta already has is not stored again (``Exist``, then
:meth:`KVTier.store` from the block's slot into a DRAM segment, or with
``--kvcache-disk-url`` :func:`~services.common.dataplane.disk_client.put_on_disk`: that ``kvcache``
instance pulls the blocks onto its disk segment, durably, before answering). Stores run as
background tasks, one at a time (a store that fails, e.g. RESOURCE_EXHAUSTED or a slot reused
before it was read, is dropped: the tier is a cache). A stored block whose slot was reused
before the write read it holds wrong bytes; every fetch verifies, so such a block costs a
recompute, never a wrong answer.

Fetch instead of recompute (:meth:`TierIO.fetch`, before an aggregated request or a P/D
prefill request is submitted, and :meth:`TierIO.lookup` again when the core admits it if
blocks resident at submission were evicted while it waited: the core's
:class:`~services.common.engine_core.core_types.Lookup`): the prompt's
full blocks beyond the local prefix hit that kvmeta holds (``Exist``, leading run) are fetched
when :func:`fetch_pays` says the modelled transfer is faster than prefilling them, into
staging slots, verified, and the request is submitted with ``fetched_tokens`` and the
modelled fetch time left after the real one (``fetch_wait_ms``). Any failure: the request
is submitted unchanged (it computes the prompt itself).

Prefetch (:meth:`TierIO.prefetch`, ahead of a request, on kvmeta's word through
:mod:`services.engine.prefetch`): a chain's blocks beyond the local prefix that the tier
holds (leading run) are read straight into cache slots reserved for them, verified, and
adopted: resident, protected, announced by the cache's STORED event like computed blocks. A
request whose first missing block a prefetch is bringing in waits for that prefetch, then
looks again: a prefetch is only started when fetching beats recomputing, so what is left
of it is shorter than recomputing (the rule of
:func:`~services.common.sessions.prefetch.on_arrival`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Callable, Sequence

import aiohttp
import grpc
from tideserve.v1 import kvmeta_pb2, kvmeta_pb2_grpc

from services.common.dataplane.blocks import mismatched
from services.common.dataplane.disk_client import DiskPutError, put_on_disk
from services.common.dataplane.tier import KVTier, block_key
from services.common.dataplane.transfer import Transfer, TransferError, TransferTimeout
from services.common.engine_core.core import EngineCore, Lookup, Request
from services.common.engine_core.kvcache import KVCache
from services.common.perfmodel import PerfProfile
from services.common.security.channels import ClientSecurity, aio_channel
from services.common.security.tokens import read_token
from services.common.tokens import block_hashes
from services.engine.api import GenRequest
from services.engine.kvbytes import KVBytes
from services.engine.settings import EngineSettings

__all__ = ["Prefetched", "TierIO", "fetch_pays", "tier_io_for"]

log = logging.getLogger(__name__)


def fetch_pays(profile: PerfProfile, cached_tokens: int, fetch_tokens: int) -> bool:
    """Fetching ``fetch_tokens`` of KV is predicted faster than computing them after
    ``cached_tokens`` of context (pure)."""
    if fetch_tokens <= 0:
        return False
    return profile.transfer_ms(fetch_tokens) < profile.prefill_ms(fetch_tokens, cached_tokens)


@dataclasses.dataclass(frozen=True, slots=True)
class Prefetched:
    """A prefetch's outcome: blocks found resident already, blocks brought back, and why it
    stopped short (empty: every block of the chain is resident now)."""

    resident: int
    fetched: int
    error: str = ""


class TierIO:
    def __init__(
        self,
        tier: KVTier,
        kvbytes: KVBytes,
        cache: KVCache,
        profile: PerfProfile,
        now_ms: Callable[[], float],
        channel: grpc.aio.Channel | None = None,
        on_freed: Callable[[], None] = lambda: None,
        disk_url: str | None = None,
    ) -> None:
        """``channel``: kvmeta's, closed with this object; ``on_freed``: called when held
        slots of evicted blocks were freed (the shell wakes its stepping loop);
        ``disk_url``: store on that kvcache instance's disk segment."""
        self._channel = channel
        self.disk_url = disk_url
        self._http: aiohttp.ClientSession | None = None
        self.on_freed = on_freed
        self.tier = tier
        self.kvbytes = kvbytes
        self.cache = cache
        self.profile = profile
        self.now_ms = now_ms
        self._pending: list[tuple[int, int]] = []  # written (cached) blocks
        self._evicted: list[tuple[int, int]] = []  # evicted blocks, slots held by the cache
        self._writer: asyncio.Task[None] | None = None
        self.stored_blocks = 0
        self.fetched_blocks = 0
        self.prefetched_blocks = 0
        self.prefetch_waits = 0  # requests that waited for a prefetch in flight
        self._freed = asyncio.Event()  # held slots were freed (a prefetch may find room)
        self._inflight: dict[int, asyncio.Event] = {}  # hash -> its prefetch's end
        self._wait_s = kvbytes.plane.settings.transfer_timeout_s  # for held slots to free
        self._lookups: set[asyncio.Task[None]] = set()  # admission-time lookups running

    # -- write-through -------------------------------------------------------------------
    def written(self, filled: Sequence[tuple[int, int]]) -> None:
        """Newly cached blocks ``(hash, slot)``: stored in the tier (in the background) when
        the cache does not hold evicted blocks (write-through)."""
        if filled and not self.cache.hold_evicted:
            self._pending.extend(filled)
            self._kick()

    def evicted(self, pairs: Sequence[tuple[int, int]]) -> None:
        """Blocks the cache evicted and holds ``(hash, slot)``: stored in the tier (in the
        background), then their slots freed."""
        if pairs:
            self._evicted.extend(pairs)
            self._kick()

    def _kick(self) -> None:
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write(), name="engine-tier-write")

    async def _write(self) -> None:
        while self._pending or self._evicted:
            batch, self._pending = self._pending, []
            held, self._evicted = self._evicted, []
            live = [(h, s) for h, s in batch if self.cache.slot_of(h) == s]  # not evicted since
            live += held  # their slots are not reused before offloaded()
            try:
                with contextlib.suppress(
                    grpc.aio.AioRpcError,
                    TransferError,
                    LookupError,
                    DiskPutError,
                    aiohttp.ClientError,
                    TimeoutError,
                ):
                    await self._store(live)
            finally:
                if held:
                    self.cache.offloaded(held)
                    self.on_freed()  # admissions waiting for these blocks may go
                    self._freed.set()

    async def _store(self, live: list[tuple[int, int]]) -> None:
        if not live:
            return
        res = await self.tier.stub.Exist(
            kvmeta_pb2.ExistRequest(
                deployment=self.tier.deployment,
                tenant=self.tier.tenant,
                keys=[block_key(h) for h, _ in live],
            )
        )
        new = [(h, s) for (h, s), there in zip(live, res.exists, strict=True) if not there]
        if new:
            addrs = [self.kvbytes.addr(s) for _, s in new]
            hashes, size = [h for h, _ in new], self.kvbytes.block_bytes
            if self.disk_url:
                if self._http is None:
                    self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60))
                segment = self.tier.plane.segment
                await put_on_disk(self._http, self.disk_url, segment, hashes, addrs, size)
            else:
                await self.tier.store(hashes, addrs, size)
            self.stored_blocks += len(new)

    async def close(self) -> None:
        for task in list(self._lookups):
            task.cancel()
        if self._writer is not None:
            self._writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._writer
        if self._http is not None:
            await self._http.close()
        if self._channel is not None:
            await self._channel.close()

    # -- fetch ---------------------------------------------------------------------------
    async def fetch(self, base: Request, gen: GenRequest) -> Request:
        """``base`` with the prefix the tier holds fetched (or ``base`` unchanged), marked
        to look the tier up again at admission (``tier_lookup``: module doc)."""
        hashes = block_hashes(gen.prompt_ids, self.cache.block_size, tenant=gen.tenant)
        tokens, wait = await self.lookup(hashes)
        if not tokens:
            return dataclasses.replace(base, tier_lookup=True)
        return dataclasses.replace(
            base, fetched_tokens=tokens, fetch_wait_ms=wait, tier_lookup=True
        )

    def answer(self, core: EngineCore, on_done: Callable[[], None]) -> None:
        """Answer ``core``'s admission-time lookups in the background (:meth:`lookup`, then
        :meth:`EngineCore.looked_up`, then ``on_done``: the shell wakes its stepping loop)."""
        for lk in core.drain_lookups():
            task = asyncio.create_task(self._answer(core, lk, on_done), name="engine-lookup")
            self._lookups.add(task)
            task.add_done_callback(self._lookups.discard)

    async def _answer(self, core: EngineCore, lk: Lookup, on_done: Callable[[], None]) -> None:
        got = (0, 0.0)
        try:
            got = await self.lookup(lk.hashes)
        finally:  # cancelled (shutdown): the turn computes its prefix
            core.looked_up(lk.rid, *got)
            on_done()

    async def lookup(self, hashes: Sequence[int]) -> tuple[int, float]:
        """Fetch the blocks of ``hashes`` beyond the local prefix that the tier holds
        (leading run) when that pays: the prompt tokens then held (local + fetched) and the
        modelled fetch time left, or ``(0, 0.0)`` (compute them). Never raises."""
        try:
            return await self._lookup(hashes)
        except Exception:  # the tier is a cache: compute instead
            log.exception("tier lookup failed, computing")
            return 0, 0.0

    async def _lookup(self, hashes: Sequence[int]) -> tuple[int, float]:
        bs = self.cache.block_size
        local = self.cache.match(hashes)
        rest = list(hashes[local:])
        coming = self._inflight.get(rest[0]) if rest else None
        if coming is not None:  # a prefetch is bringing it in: shorter than recomputing
            self.prefetch_waits += 1
            await coming.wait()
            local = self.cache.match(hashes)
            rest = list(hashes[local:])
        if not rest:
            return 0, 0.0
        try:
            res = await self.tier.stub.Exist(
                kvmeta_pb2.ExistRequest(
                    deployment=self.tier.deployment,
                    tenant=self.tier.tenant,
                    keys=[block_key(h) for h in rest],
                )
            )
        except grpc.aio.AioRpcError as err:
            log.info("tier lookup failed, computing: %s", err.details())
            return 0, 0.0
        run = next((i for i, there in enumerate(res.exists) if not there), len(rest))
        if not fetch_pays(self.profile, local * bs, run * bs):
            return 0, 0.0
        want = rest[:run]
        t0 = self.now_ms()

        async def read(addrs: list[int]) -> Transfer:
            got = await self.tier.fetch(want, addrs, self.kvbytes.block_bytes)
            return Transfer(got.nbytes, got.ms)

        pulled = await self.kvbytes.receive(want, read)
        if not pulled.ok:
            return 0, 0.0
        self.fetched_blocks += run
        spent = self.now_ms() - t0
        return (local + run) * bs, max(0.0, self.profile.transfer_ms(run * bs) - spent)

    async def prefetch(self, hashes: Sequence[int], tenant: str = "") -> Prefetched:
        """Bring the chain ``hashes`` (parent first, from the start of a sequence) back into
        the cache from the tier (module doc). Never raises."""
        local = self.cache.match(hashes)
        rest = list(hashes[local:])
        if not rest:
            return Prefetched(local, 0)
        done = asyncio.Event()  # a request needing these blocks waits for it from now on
        mine = [h for h in rest if self._inflight.setdefault(h, done) is done]
        try:
            return await self._prefetch(rest, hashes[local - 1] if local else 0, local, tenant)
        finally:
            for h in mine:
                del self._inflight[h]
            done.set()

    async def _prefetch(self, rest: list[int], parent: int, local: int, tenant: str) -> Prefetched:
        """The leading run of ``rest`` the tier holds, read into the cache."""
        try:
            res = await self.tier.stub.Exist(
                kvmeta_pb2.ExistRequest(
                    deployment=self.tier.deployment,
                    tenant=self.tier.tenant,
                    keys=[block_key(h) for h in rest],
                )
            )
        except grpc.aio.AioRpcError as err:
            return Prefetched(local, 0, f"tier lookup failed: {err.details()}")
        run = next((i for i, there in enumerate(res.exists) if not there), len(rest))
        if run == 0:
            return Prefetched(local, 0, "the tier holds none of the missing blocks")
        error = await self._read_into_cache(rest[:run], parent, tenant)
        if error:
            return Prefetched(local, 0, error)
        self.prefetched_blocks += run
        short = "" if run == len(rest) else f"the tier holds {run} of {len(rest)} missing blocks"
        return Prefetched(local, run, short)

    async def _read_into_cache(self, want: list[int], parent: int, tenant: str) -> str:
        """Reserve cache slots for ``want``, read them from the tier into those slots,
        verify and adopt them; the error that stopped it, or ''."""
        slots = self.cache.reserve(len(want))
        for _ in range(3):  # evicted blocks are being stored: their slots come back
            # what reserve evicted is stored now (the stepping loop may be idle)
            self.evicted(self.cache.drain_evicted())
            if slots is not None or not self.cache.held_slots:
                break
            self._freed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._freed.wait(), self._wait_s)
            slots = self.cache.reserve(len(want))
        self.evicted(self.cache.drain_evicted())
        if slots is None:
            return f"no room for {len(want)} blocks"
        try:
            addrs = [self.kvbytes.addr(s) for s in slots]
            await self.tier.fetch(want, addrs, self.kvbytes.block_bytes)
        except TransferTimeout as err:  # the slots stay out of use until the read returns
            err.pending.add_done_callback(lambda _f: self.cache.unreserve(slots))
            return str(err)
        except (TransferError, LookupError, grpc.aio.AioRpcError) as err:
            self.cache.unreserve(slots)
            return str(err)
        assert self.kvbytes.arena is not None
        size = self.kvbytes.block_bytes
        got = [self.kvbytes.arena.read(s * size, size) for s in slots]
        if mismatched(want, got):
            self.cache.unreserve(slots)
            return "received blocks have wrong bytes"
        self.cache.adopt(list(zip(want, slots, strict=True)), parent, tenant)
        return ""


def kvmeta_channel(settings: EngineSettings) -> grpc.aio.Channel:
    """The engine's channel to kvmeta: TLS and the operator token from its settings (kvmeta
    refuses object and segment writes without one when its auth is on)."""
    token = read_token(settings.kvmeta_token_file) if settings.kvmeta_token_file else None
    return aio_channel(
        settings.kvmeta_address, ClientSecurity(tls=settings.kvmeta_tls, token=token)
    )


def tier_io_for(
    settings: EngineSettings,
    kvbytes: KVBytes,
    core: EngineCore,
    now_ms: Callable[[], float],
    on_freed: Callable[[], None],
) -> TierIO:
    """The engine's link to the tier (call on the event loop: it opens kvmeta's channel)."""
    channel = kvmeta_channel(settings)
    tier = KVTier(kvmeta_pb2_grpc.KVMetaServiceStub(channel), kvbytes.plane, settings.deployment)
    return TierIO(
        tier,
        kvbytes,
        core.cache,
        core.profile,
        now_ms,
        channel,
        on_freed,
        settings.kvcache_disk_url,
    )
