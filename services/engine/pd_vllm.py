"""vLLM-style disaggregated prefill/decode in the engine simulator (shell helper).

The convention is the one vLLM's NixlConnector and its toy P/D proxy use, with the same
field names in ``kv_transfer_params`` (on ``/v1/completions``, ``/v1/chat/completions`` and,
as an extension, ``/generate``):

1. **Prefill.** The proxy sends the request with ``max_tokens=1`` (chat: also
   ``max_completion_tokens=1``), ``stream=false`` and ``kv_transfer_params =
   {"do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id": null,
   "remote_block_ids": null, "remote_host": null, "remote_port": null}``. The engine (any
   role; vLLM calls it ``kv_producer``/``kv_both``) computes the prompt, answers with its one
   token (``usage`` carries the prefill's own prefix-cache hit as ``cached_tokens``) and
   HOLDS the prompt's KV. The non-streamed answer has, at top level, ``kv_transfer_params =
   {"do_remote_prefill": true, "do_remote_decode": false, "remote_engine_id": <instance id>,
   "remote_request_id": <its request id>, "remote_block_ids": [0, ..., n-1] (one per prompt
   block; the simulator has no physical block table), "remote_host", "remote_port": <this
   engine's HTTP address as the caller reached it>, "tp_size": <profile tp>}``.
2. **Decode.** The proxy sends the original request (streamed or not, as the client asked)
   with those params. The decode engine reserves the blocks, *pulls* the KV of the prompt
   tokens it does not hold locally (modelled as ``perfmodel.transfer_ms(missing tokens)``;
   no bytes move), recomputes the last prompt token and samples its first token (the
   prefill's token is discarded, as in vLLM). Its ``usage`` reports
   ``cached_tokens = prompt_tokens - 1`` (local hits + pulled tokens), which is what vLLM's
   scheduler reports as ``num_cached_tokens`` on the decode side of a NIXL hand-off.
3. **Release.** When the pull has ended, the decode engine POSTs
   ``{"request_id": <remote_request_id>, "status": "done"}`` to
   ``http://<remote_host>:<remote_port>/kv_transfer/notify`` (vLLM: the NIXL notification);
   the prefill frees the KV on receipt. A decode request aborted before its pull ended
   notifies ``"aborted"`` (vLLM instead waits ``VLLM_NIXL_ABORT_REQUEST_TIMEOUT``). KV nobody
   claims is freed after the engine's ``hold_timeout_s``.

Real KV bytes (``--kv-data-plane``; :mod:`services.engine.pd_bytes`): the prefill's answer
adds ``"tideserve_kv"`` (where the blocks are: segment, block bytes, one address per full
prompt block); the decode engine pulls and verifies them before it submits, and when the pull
fails it notifies ``"aborted"`` and prefills locally.

A decode request whose params lack ``remote_block_ids``, ``remote_host``, ``remote_port`` or
``remote_request_id`` is prefilled locally, as vLLM does when there is nothing to pull.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import web

from services.common.engine_core.core import EngineCore, Request
from services.engine.api import GenRequest
from services.engine.info_routes import bad_request

__all__ = ["NOTIFY_PATH", "RemoteKV", "notify_handler"]

log = logging.getLogger(__name__)

NOTIFY_PATH = "/kv_transfer/notify"


class RemoteKV:
    """Per-engine state of vLLM-style hand-offs: which local requests pull from which peer.
    Notifications are best effort (a peer that cannot be reached frees on its timeout)."""

    def __init__(
        self, engine_id: str, tp_size: int, block_size: int, notify_timeout_s: float = 5.0
    ) -> None:
        self.engine_id = engine_id
        self.tp_size = tp_size
        self.block_size = block_size
        self.notify_timeout_s = notify_timeout_s
        self._pulls: dict[str, tuple[str, int, str]] = {}  # rid -> (host, port, remote rid)
        self._tasks: set[asyncio.Task[None]] = set()
        self.notified = 0

    def core_request(self, rid: str, gen: GenRequest) -> Request | None:
        """The core request for a ``kv_transfer_params`` request, or None (no such params,
        or nothing to pull: prefill locally)."""
        kv = gen.kv_transfer
        if kv is None:
            return None
        if kv.do_remote_decode:
            return Request(rid, gen.prompt_ids, gen.max_new_tokens, gen.tenant, hold_kv=True)
        if (
            kv.do_remote_prefill
            and kv.remote_block_ids
            and kv.remote_host
            and kv.remote_port
            and kv.remote_request_id
        ):
            self._pulls[rid] = (kv.remote_host, kv.remote_port, kv.remote_request_id)
            return Request(rid, gen.prompt_ids, gen.max_new_tokens, gen.tenant, remote_prefill=True)
        return None

    def response_params(
        self,
        rid: str,
        gen: GenRequest,
        host: str,
        port: int,
        location: Callable[[], dict[str, Any]] | None = None,
    ) -> dict[str, Any] | None:
        """``kv_transfer_params`` for the answer of a prefill request (None otherwise);
        ``location()``: where the blocks are (real bytes), as ``tideserve_kv``."""
        kv = gen.kv_transfer
        if kv is None or not kv.do_remote_decode:
            return None
        blocks = -(-len(gen.prompt_ids) // self.block_size)
        return {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_engine_id": self.engine_id,
            "remote_request_id": rid,
            "remote_block_ids": list(range(blocks)),
            "remote_host": host,
            "remote_port": port,
            "tp_size": self.tp_size,
            **({"tideserve_kv": location()} if location is not None else {}),
        }

    def pulled(self, session: aiohttp.ClientSession | None, rids: tuple[str, ...]) -> None:
        """The pulls of ``rids`` ended: tell their peers they may free."""
        for rid in rids:
            self._notify(session, rid, "done")

    def finish(self, session: aiohttp.ClientSession | None, rid: str) -> None:
        """The local request ended; if its pull had not ended, the peer may free now."""
        self._notify(session, rid, "aborted")

    def release(
        self, session: aiohttp.ClientSession | None, host: str, port: int, remote: str, status: str
    ) -> None:
        """Tell the peer at ``host:port`` that it may free ``remote`` (best effort)."""
        if session is None:
            return
        task = asyncio.create_task(self._post(session, host, port, remote, status))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _notify(self, session: aiohttp.ClientSession | None, rid: str, status: str) -> None:
        peer = self._pulls.pop(rid, None)
        if peer is not None:
            self.release(session, *peer, status)

    async def _post(
        self, session: aiohttp.ClientSession, host: str, port: int, remote: str, status: str
    ) -> None:
        url = f"http://{host}:{port}{NOTIFY_PATH}"
        try:
            async with session.post(
                url,
                json={"request_id": remote, "status": status},
                timeout=aiohttp.ClientTimeout(total=self.notify_timeout_s),
            ) as resp:
                await resp.read()
                self.notified += 1
        except (aiohttp.ClientError, TimeoutError, OSError) as err:
            log.info("KV release notification to %s failed: %r", url, err)

    async def close(self) -> None:
        """Let pending notifications finish (bounded by their timeout)."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)


def notify_handler(
    core: EngineCore, now_ms: Callable[[], float], kick: asyncio.Event
) -> Callable[[web.Request], Awaitable[web.Response]]:
    """The ``NOTIFY_PATH`` route: vLLM-style release, ``{"request_id", "status"}`` from the
    decode side; the held KV of that request is freed now (``kick`` wakes the step loop).
    Answers ``{"freed": bool, "request_id"}``."""

    async def handle(req: web.Request) -> web.Response:
        try:
            body = await req.json()
            rid = body["request_id"] if isinstance(body, dict) else None
            if not isinstance(rid, str):
                raise ValueError
        except (ValueError, KeyError, UnicodeDecodeError):
            return bad_request("expected a JSON object with a string 'request_id'", "request_id")
        freed = core.hand_off(rid, now_ms())
        kick.set()
        return web.json_response({"freed": freed, "request_id": rid})

    return handle
