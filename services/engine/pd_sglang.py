"""SGLang-style disaggregation in the engine simulator (shell helper).

A request carrying ``bootstrap_host``/``bootstrap_port``/``bootstrap_room`` is one half of a
P/D pair that a router sent to a prefill and a decode instance at once. The prefill
instance computes the prompt and holds its KV under the room; it serves
``GET /bootstrap/{room}`` (on its HTTP port and, if ``--bootstrap-port`` is set, on that
port too), a long poll answered once the room's prefill is done with ``{"prompt_tokens",
"cached_tokens", "transfer_ms", "room"}``; the prefill then frees the KV after the modelled
transfer time. The decode instance with the same room calls that endpoint, reserves the
blocks, waits ``transfer_ms`` of modelled time, then decodes from the prefill's first token.
A decode request without a ``bootstrap_port`` is prefilled locally.

Real KV bytes (``--kv-data-plane`` on both; :mod:`services.engine.pd_bytes`): the room's
answer adds ``"request_id"`` and ``"kv"`` (where the blocks are); the prefill no longer frees
after the modelled transfer but when the decode side notifies ``POST /kv_transfer/notify``
(served on the bootstrap port too) or after its hold timeout. The decode side pulls and
verifies the blocks, notifies (``done``, or ``aborted`` when the pull failed) and then
decodes, or prefills itself when the pull failed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from services.common.dataplane.location import KVLocation
from services.common.engine_core.core import EngineCore, Request, SeqOutput
from services.common.perfmodel import PerfProfile
from services.common.tasks import pause
from services.engine import api
from services.engine.pd_bytes import PDBytes

__all__ = ["Rendezvous"]

log = logging.getLogger(__name__)


@dataclass
class _Room:
    done: asyncio.Event = field(default_factory=asyncio.Event)
    rid: str | None = None
    info: dict[str, Any] | None = None
    created: float = field(default_factory=time.monotonic)


class Rendezvous:
    """The rooms of one engine instance (prefill side) and the decode side's fetch."""

    def __init__(
        self,
        core: EngineCore,
        profile: PerfProfile,
        now_ms: Callable[[], float],
        kick: Callable[[], None],
        *,
        bootstrap_timeout_s: float,
        hold_timeout_s: float,
        kv: PDBytes | None = None,
        release: Callable[[str, int, str, str], None] | None = None,
    ) -> None:
        """``kv``: move real bytes (None = model the transfer only); ``release(host, port,
        request_id, status)``: tell a prefill peer it may free (the vLLM notification)."""
        self.kv = kv
        self.release = release
        self.core = core
        self.profile = profile
        self.now_ms = now_ms
        self.kick = kick
        self.bootstrap_timeout_s = bootstrap_timeout_s
        self.hold_timeout_s = hold_timeout_s
        self._rooms: dict[int, _Room] = {}

    def prefill_request(self, rid: str, gen: api.GenRequest) -> Request:
        """Prefill side: hold the KV of ``rid`` under the request's room."""
        assert gen.bootstrap is not None
        self._rooms.setdefault(gen.bootstrap.room, _Room()).rid = rid
        return Request(rid, gen.prompt_ids, gen.max_new_tokens, gen.tenant, hold_kv=True)

    def prefill_done(self, gen: api.GenRequest, out: SeqOutput) -> None:
        """Prefill side: the request of ``gen`` finished; answer its room's long poll."""
        if gen.bootstrap is None:
            return
        room = self._rooms.setdefault(gen.bootstrap.room, _Room())
        room.rid = out.rid
        room.info = {
            "prompt_tokens": out.prompt_tokens,
            "cached_tokens": out.cached_tokens,
            "request_id": out.rid,
        }
        if self.kv is not None:
            room.info["kv"] = self.kv.locate(gen).to_json()
        room.done.set()

    async def decode_request(
        self, session: aiohttp.ClientSession, rid: str, gen: api.GenRequest
    ) -> Request | web.Response:
        """Decode side: wait for the prefill peer's room, then a request that waits for the
        modelled transfer. A 502 response when the rendezvous failed."""
        b = gen.bootstrap
        assert b is not None and b.port is not None
        url = f"http://{b.host}:{b.port}/bootstrap/{b.room}"
        timeout = aiohttp.ClientTimeout(total=self.bootstrap_timeout_s + 5.0)
        try:
            async with session.get(url, timeout=timeout) as resp:
                info = await resp.json()
                if resp.status != 200:
                    raise RuntimeError(info.get("error", {}).get("message", resp.status))
        except (aiohttp.ClientError, TimeoutError, RuntimeError, ValueError) as err:
            msg = f"KV bootstrap with {b.host}:{b.port} room {b.room} failed: {err}"
            return web.json_response(
                api.error_body(msg, "server_error", None, "bootstrap"), status=502
            )
        transfer_ms = float(info["transfer_ms"])
        if "kv" in info:  # the prefill holds real bytes until it hears from this side
            spent: float | None = 0.0  # no data plane here: only the modelled transfer
            if self.kv is not None:
                try:
                    spent = await self.kv.pull(rid, gen, KVLocation.from_json(info["kv"]))
                except ValueError as err:
                    log.warning("bootstrap room %s: bad 'kv' (%s), recomputing", b.room, err)
                    self.kv.failed(rid)
                    spent = None
            if self.release is not None and isinstance(info.get("request_id"), str):
                status = "aborted" if spent is None else "done"
                self.release(b.host, b.port, info["request_id"], status)
            if spent is None:  # recompute here
                return Request(rid, gen.prompt_ids, gen.max_new_tokens, gen.tenant)
            transfer_ms = max(0.0, transfer_ms - spent)
        return Request(
            rid,
            gen.prompt_ids,
            gen.max_new_tokens,
            gen.tenant,
            kv_transfer_ms=transfer_ms,
            peer_cached_tokens=int(info.get("cached_tokens", 0)),
        )

    async def handler(self, req: web.Request) -> web.Response:
        """``GET /bootstrap/{room}``: the long poll (400 bad room, 504 no prefill in time)."""
        try:
            room_id = int(req.match_info["room"])
        except ValueError:
            return web.json_response(
                api.error_body("room must be an integer", "invalid_request_error", "room"),
                status=400,
            )
        room = self._rooms.setdefault(room_id, _Room())
        if not await pause(room.done, self.bootstrap_timeout_s):
            self._rooms.pop(room_id, None)
            return web.json_response(
                api.error_body(f"room {room_id}: no prefill finished in time", "timeout"),
                status=504,
            )
        self._rooms.pop(room_id, None)
        info = dict(room.info or {})
        transfer = self.profile.transfer_ms(int(info.get("prompt_tokens", 0)))
        if room.rid is not None and "kv" not in info:  # with real bytes: on notification
            self.core.hand_off(room.rid, self.now_ms() + transfer)
            self.kick()
        info.update(room=room_id, transfer_ms=transfer)
        return web.json_response(info)

    def expire(self) -> None:
        """Forget rooms nobody claimed within the hold and bootstrap timeouts."""
        horizon = time.monotonic() - self.hold_timeout_s - self.bootstrap_timeout_s
        for room, r in list(self._rooms.items()):
            if r.created < horizon:
                del self._rooms[room]
