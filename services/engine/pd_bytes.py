"""P/D hand-off of real KV bytes (shell helper shared by the SGLang and vLLM flows).

Prefill side: :meth:`PDBytes.locate` lists where a finished prompt's full blocks are in this
engine's arena (:class:`KVLocation`); the SGLang bootstrap answer carries it as ``"kv"``,
vLLM's ``kv_transfer_params`` as ``"tideserve_kv"``. The prefill then holds the KV until the
decode side notifies (``POST /kv_transfer/notify``) or its hold timeout.

Decode side: :meth:`PDBytes.pull` hashes the prompt as the prefill did, skips the blocks it
holds itself, pulls the rest over the Transfer Engine and verifies every byte. On success it
returns the modelled milliseconds the pull took (the core waits only for what is left of the
modelled hand-off) and keeps the wall time of the transfer for the request's answer
(``usage.kv_transfer_ms`` and ``kv_transfer_bytes``, or ``kv_transfer_failed``: :meth:`take`). On any failure (transfer error, timeout, wrong
bytes, no staging space) it returns None and the caller prefills locally: a recompute, never
a wrong answer and never a hung request (every pull is bounded by ``kv_transfer_timeout_s``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from services.common.dataplane.location import KVLocation
from services.common.engine_core.kvcache import KVCache
from services.common.tokens import block_hashes
from services.engine.api import GenRequest, kv_transfer_fields
from services.engine.kvbytes import KVBytes

__all__ = ["PDBytes"]


class PDBytes:
    def __init__(
        self,
        kvbytes: KVBytes,
        cache: KVCache,
        now_ms: Callable[[], float],
        *,
        timeout_s: float,
        on_pull: Callable[[bool, int, float], None] | None = None,
    ) -> None:
        """``on_pull(ok, bytes, wall ms)`` after every pull (the engine's metrics)."""
        self.on_pull = on_pull
        self.kvbytes = kvbytes
        self.cache = cache
        self.now_ms = now_ms
        self.timeout_s = timeout_s
        self._done: dict[str, dict[str, Any]] = {}  # rid -> its usage fields
        self.recomputed = 0

    def _hashes(self, gen: GenRequest) -> list[int]:
        return block_hashes(gen.prompt_ids, self.cache.block_size, tenant=gen.tenant)

    def locate(self, gen: GenRequest) -> KVLocation:
        """Prefill side: where the prompt's leading resident full blocks are."""
        return self.kvbytes.location([self.cache.slot_of(h) for h in self._hashes(gen)])

    async def pull(self, rid: str, gen: GenRequest, loc: KVLocation) -> float | None:
        """Decode side: pull and verify what is not resident here; the modelled ms it took,
        or None (recompute)."""
        hashes = self._hashes(gen)
        t0 = self.now_ms()
        res = await self.kvbytes.pull(loc, hashes, self.cache.match(hashes), self.timeout_s)
        if not res.ok:
            self.failed(rid)
            return None
        if self.on_pull is not None:
            self.on_pull(True, res.nbytes, res.ms)
        self._done[rid] = kv_transfer_fields(res.ms, res.nbytes, failed=False)
        return self.now_ms() - t0

    def failed(self, rid: str) -> None:
        """Count a hand-off of ``rid`` that recomputes (a failed pull, or a location that is
        no good)."""
        self.recomputed += 1
        self._done[rid] = kv_transfer_fields(0.0, 0, failed=True)
        if self.on_pull is not None:
            self.on_pull(False, 0, 0.0)

    def take(self, rid: str) -> dict[str, Any]:
        """``rid``'s pull as usage fields (:func:`kv_transfer_fields`; empty if none),
        forgotten after."""
        return self._done.pop(rid, {})
