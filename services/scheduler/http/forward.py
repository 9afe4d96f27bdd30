"""Forwarding one pick to its engines (aiohttp I/O only): the P/D flows and the decode call.

An aggregated pick (no prefill endpoint) sends the client's body to the decode endpoint.
A disaggregated pick follows the deployment's ``pd_protocol``:

- ``sglang``: the same body plus ``bootstrap_host``, ``bootstrap_port`` and
  ``bootstrap_room`` goes to the prefill and the decode instance at once; the prefill
  answer is drained in the background. When the decode call fails, the prefill is blamed
  (the retry excludes it, not the decode) if its own call failed or it does not answer a
  health probe: a decode whose bootstrap peer died answers 5xx.
- ``vllm``: the prefill runs first (``max_tokens=1``, ``kv_transfer_params``;
  :mod:`services.scheduler.http.pd_vllm`), then the decode with the returned
  parameters; a 4xx from the prefill is handed back to the client unchanged.

Either way the decode answer is relayed (:mod:`services.scheduler.http.relay`). A
Messages request (:mod:`services.scheduler.http.messages`) goes to the engine's
``/v1/messages`` when the deployment serves it natively (``native_apis``) and the pick is
aggregated; otherwise its canonical chat body goes to ``/v1/chat/completions`` and the
answer is translated back.
Raises :class:`~services.scheduler.http.upstream.UpstreamFailure` before the first
byte (the caller retries elsewhere); cancellation (pre-emption, client gone) leaves no
orphan prefill task.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any, Literal

import aiohttp
from aiohttp import web

from services.common import otel
from services.common.routing.types import EndpointView, Pick
from services.common.scheduling.service import GatewayCore
from services.scheduler.core.records import RequestContext
from services.scheduler.http import messages, pd_vllm, upstream
from services.scheduler.http.metrics import GatewayMetrics
from services.scheduler.http.openai import Kind, ParsedRequest
from services.scheduler.http.relay import AnswerTranslator, FirstByte, relay_body, relay_stream

__all__ = ["PATHS", "Forwarder"]

PATHS: dict[Kind, str] = {
    "chat": "/v1/chat/completions",
    "completion": "/v1/completions",
    "generate": "/generate",
    "messages": "/v1/chat/completions",  # its canonical chat body (native: messages.PATH)
    "responses": "/v1/chat/completions",  # the canonical form; native: the Turn's path
}


class Forwarder:
    """Sends picks upstream; holds no per-request state."""

    def __init__(
        self,
        core: GatewayCore,
        *,
        pd_protocol: Literal["sglang", "vllm"],
        upstream_timeout_s: float,
        connect_timeout_s: float,
        clock: Callable[[], float],
        rng: random.Random,
        metrics: GatewayMetrics,
        first_byte: FirstByte,
        authorization: str | bool = False,
        native_apis: frozenset[str] = frozenset(),
    ) -> None:
        """``authorization``: the engines' ``Authorization`` header: a fixed value, True
        (the client's, when it sent one) or False (none); ``native_apis``: the APIs besides
        OpenAI's the engines serve themselves (``messages``)."""
        self.core = core
        self.native_apis = native_apis
        self.authorization = authorization
        self.pd_protocol = pd_protocol
        self.upstream_timeout_s = upstream_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.timeout = aiohttp.ClientTimeout(
            total=upstream_timeout_s, sock_connect=connect_timeout_s
        )
        self.clock = clock
        self.rng = rng
        self.metrics = metrics
        self.first_byte = first_byte

    async def forward(
        self,
        session: aiohttp.ClientSession,
        req: web.Request,
        ctx: RequestContext,
        p: ParsedRequest,
        d: Pick,
        pick_id: str,
        answer: AnswerTranslator | None = None,
    ) -> web.StreamResponse:
        """The client's answer for pick ``d`` (see the module docstring; ``answer``: the
        client speaks another API, :mod:`services.scheduler.http.responses`; a Messages
        request's is made here, :mod:`services.scheduler.http.messages`)."""
        native = p.kind == "messages" and "messages" in self.native_apis and d.prefill is None
        if answer is None:
            answer = messages.messages_answer(p, native, ctx)
        path = answer.path if answer is not None else PATHS[p.kind]
        body: dict[str, Any] = p.forward_body if d.prefill is None else dict(p.forward_body)
        if native and p.native_body is not None:
            body = p.native_body
        kind: Kind = "chat" if p.kind in ("messages", "responses") else p.kind
        headers = {"Content-Type": "application/json"}
        if not otel.recording():
            # No client span (the session is the plain one): the current trace context
            # (traceparent, baggage). A recorded request's traced session injects its span's.
            otel.inject(headers)
        auth = self.authorization
        if isinstance(auth, str):
            headers["Authorization"] = auth
        elif auth and "Authorization" in req.headers:
            headers["Authorization"] = req.headers["Authorization"]
        timeout = self.timeout
        decode = d.decode.endpoint
        prefill_task: asyncio.Task[None] | None = None
        if d.prefill is not None and self.pd_protocol == "vllm":
            headers["X-Request-Id"] = pick_id
            step = await self._prefill_vllm(
                session, ctx, d.prefill.endpoint, kind, path, body, headers, timeout, pick_id
            )
            if isinstance(step, web.Response):
                return step
            body = step
        elif d.prefill is not None:
            prefill_task = self._prefill_sglang(
                session, d.prefill.endpoint, path, body, headers, timeout
            )
        # Aggregated and the client's body needs no change: its bytes as they came.
        payload: bytes | dict[str, Any] = body
        if d.prefill is None and p.raw_body:
            payload = p.raw_body
        try:
            resp = await upstream.open_upstream(session, decode, path, payload, headers, timeout)
        except upstream.UpstreamFailure as f:
            prefill = d.prefill.endpoint if d.prefill is not None else None
            raise await self._culprit(session, f, prefill, prefill_task) from None
        except BaseException:  # cancelled (pre-empted, client gone): no orphan prefill
            await upstream.cancel_quietly(prefill_task)
            raise
        try:
            if not p.stream or resp.status != 200:
                return await relay_body(
                    ctx,
                    resp,
                    decode.instance_id,
                    pick_id,
                    core=self.core,
                    clock=self.clock,
                    first_byte=self.first_byte,
                    answer=answer,
                )
            return await relay_stream(
                req,
                ctx,
                resp,
                decode.instance_id,
                pick_id,
                core=self.core,
                clock=self.clock,
                metrics=self.metrics,
                first_byte=self.first_byte,
                answer=answer,
            )
        except BaseException:
            resp.close()  # e.g. pre-empted before the first byte: the engine aborts it
            if prefill_task is not None:
                prefill_task.cancel()
            raise
        finally:
            resp.release()
            if prefill_task is not None and not prefill_task.done():
                # The decode side answered; let the prefill half finish in the background.
                prefill_task.add_done_callback(_swallow)

    async def _culprit(
        self,
        session: aiohttp.ClientSession,
        failure: upstream.UpstreamFailure,
        prefill: EndpointView | None,
        task: asyncio.Task[None] | None,
    ) -> upstream.UpstreamFailure:
        """The failure to retry on, when the decode call of an SGLang-style pick failed: the
        prefill's own when its call failed too, or the prefill's when it does not answer a
        health probe (a decode whose bootstrap peer died answers 5xx: blaming it would
        exclude a healthy decode, and with one decode refuse the request); else the
        decode's. The prefill half is cancelled either way."""
        if task is None or prefill is None:
            return failure
        alive = await upstream.probe(session, prefill.url, self.connect_timeout_s)
        if task.done() and not task.cancelled():
            exc = task.exception()
            if isinstance(exc, upstream.UpstreamFailure):
                return exc
        await upstream.cancel_quietly(task)
        if not alive:
            reason = f"prefill unreachable after its decode failed ({failure.reason})"
            return upstream.UpstreamFailure(prefill.instance_id, reason)
        return failure

    async def _prefill_vllm(
        self,
        session: aiohttp.ClientSession,
        ctx: RequestContext,
        prefill: EndpointView,
        kind: Kind,
        path: str,
        body: dict[str, Any],
        headers: dict[str, str],
        client_timeout: aiohttp.ClientTimeout,
        pick_id: str,
    ) -> dict[str, Any] | web.Response:
        """The decode body after a finished prefill, or the client's answer when the
        prefill refused the request (4xx)."""
        step = await pd_vllm.run_prefill(
            session, prefill, kind, path, body, headers, client_timeout
        )
        if isinstance(step, pd_vllm.PrefillRefused):
            self.first_byte(pick_id)
            ctx.whole(self.clock(), step.body)
            return web.Response(status=step.status, body=step.body, content_type=step.content_type)
        self.core.fleet.first_token(pick_id)  # the prompt is computed: no pending prefill
        self.core.fleet.upstream_result(prefill.instance_id, True, self.clock())
        return step

    def _prefill_sglang(
        self,
        session: aiohttp.ClientSession,
        prefill: EndpointView,
        path: str,
        body: dict[str, Any],
        headers: dict[str, str],
        timeout: aiohttp.ClientTimeout,
    ) -> asyncio.Task[None]:
        """Adds the bootstrap fields to ``body`` (in place: the decode call sends the same
        body) and starts the prefill half in the background."""
        body.update(upstream.bootstrap_fields(prefill, self.rng.getrandbits(62)))
        return asyncio.create_task(
            upstream.drain_prefill(session, prefill, path, body, headers, timeout)
        )


def _swallow(t: asyncio.Task[None]) -> None:
    if not t.cancelled():
        t.exception()
