"""The OpenAI Responses API of the gateway: ``POST /v1/responses`` (through the same
intake as chat), ``GET`` and ``DELETE /v1/responses/{id}``.

``POST``: the body is validated and translated (:mod:`services.common.apis.responses`);
with ``previous_response_id`` the stored chain is read (:mod:`services.scheduler.responses`)
and rebuilt in front of this turn's input; the result is ONE canonical chat-completions
body, parsed by :func:`~services.scheduler.http.openai.parse_request` (kind
``responses``: the chat tokenization path, so prompt ids and block hashes are those of the
equivalent chat request; the common metadata headers apply). After admission and routing
the :class:`Turn` is the relay's :class:`~services.scheduler.http.relay.AnswerTranslator`:

- default: the canonical chat body goes to the engine's ``/v1/chat/completions`` and its
  answer (whole or streamed) is translated into a ``response``;
- ``native_apis`` holding ``responses`` (engines that serve the API, e.g. vLLM): the
  engine's ``/v1/responses`` gets the rebuilt context as ``input`` items, no
  ``previous_response_id`` and ``store: false``; its answer is passed on with the
  gateway's response id.

Storing: ``store`` defaults to true (as OpenAI). The response is stored before its last
byte (``response.completed``) reaches the client, so the next turn may go to any replica.
Without a store (no ``postgres_url``): ``store`` left out is not stored (the response says
``store: false``), ``store: true`` and ``previous_response_id`` are refused (400). A store
that fails answers 500 ``store_failed`` (streamed: ``response.failed``); nothing stored
before is touched.

A tenant sees only its own stored responses (with API keys, the key's tenant; otherwise
``X-Tideserve-Tenant`` / ``tenant``). An unknown, expired or foreign
``previous_response_id`` is 400 ``previous_response_not_found`` (OpenAI's answer); an
unknown id on ``GET``/``DELETE`` is 404.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from aiohttp import web

from services.common import jsonfast
from services.common.apis.responses import (
    ResponsesError,
    ResponsesRequest,
    as_map,
    chat_body,
    native_body,
    new_response_id,
    parse_responses,
)
from services.common.apis.responses_answer import from_chat
from services.common.apis.responses_native import NativeResponses, patch_response
from services.common.apis.responses_stream import ChatToResponses, final_event
from services.scheduler.core.records import RequestContext
from services.scheduler.http.openai import H_TENANT, ApiError, ParsedRequest, json_body
from services.scheduler.keys.gate import KEY_KEY
from services.scheduler.responses.chain import ChainBroken, StoredResponse, rebuild, visible
from services.scheduler.responses.store import ResponseStore

__all__ = ["ResponsesApi", "Turn"]

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

_RENAMED = {"messages": "input", "max_tokens": "max_output_tokens"}


def _not_found(rid: str) -> ApiError:
    return ApiError(
        400,
        f"Previous response with id '{rid}' not found.",
        "previous_response_id",
        "previous_response_not_found",
    )


def _api_error(e: ResponsesError) -> ApiError:
    return ApiError(400, e.message, e.param, e.code)


def _renamed(e: ApiError) -> ApiError:
    """A chat-side error in the Responses request's names."""
    if e.param in _RENAMED:
        new = _RENAMED[e.param]
        return ApiError(
            e.status, e.message.replace(f"'{e.param}'", f"'{new}'"), new, e.code, e.etype
        )
    return e


def _request(raw: bytes, max_body_bytes: int) -> ResponsesRequest:
    body = json_body(raw, max_body_bytes)
    try:
        return parse_responses(body)
    except ResponsesError as e:
        raise _api_error(e) from None


def _chat_equivalent(response: Mapping[str, Any]) -> dict[str, Any]:
    """A stored/native response as a chat completion body (usage and tool calls for the
    request record)."""
    usage = as_map(response.get("usage"))
    cached = as_map(usage.get("input_tokens_details")).get("cached_tokens", 0)
    calls = [
        {
            "id": it.get("call_id"),
            "type": "function",
            "function": {"name": it.get("name"), "arguments": it.get("arguments")},
        }
        for it in response.get("output") or []
        if isinstance(it, Mapping) and it.get("type") == "function_call"
    ]
    body = {
        "choices": [{"index": 0, "message": {"role": "assistant", "tool_calls": calls}}],
        "usage": {
            "prompt_tokens": usage.get("input_tokens", 0),
            "completion_tokens": usage.get("output_tokens", 0),
            "prompt_tokens_details": {"cached_tokens": cached},
        },
    }
    return body


class Turn:
    """One ``POST /v1/responses`` in flight: its translated request and how its answer
    reaches the client (the relay's AnswerTranslator)."""

    def __init__(
        self,
        api: ResponsesApi,
        ctx: RequestContext,
        req: ResponsesRequest,
        history: list[dict[str, Any]],
        chain: Mapping[str, StoredResponse],
        store: bool,
    ) -> None:
        self.api, self.ctx, self.req, self.history, self.chain = api, ctx, req, history, chain
        self.store = store
        self.native = api.native
        self.resp_id = new_response_id()
        self.created_at = int(api.wall())
        self.path = "/v1/responses" if self.native else "/v1/chat/completions"
        self.tenant = ""
        if self.native:  # its tool calls are read off the response (end / whole)
            ctx.stream_tools = False
        self._stream: ChatToResponses | NativeResponses = (
            NativeResponses(req, self.resp_id, self.created_at, store)
            if self.native
            else ChatToResponses(req, self.resp_id, self.created_at, store)
        )
        if isinstance(self._stream, ChatToResponses):  # it parses every chunk: the record's
            ctx.facts = self._stream.facts

    @property
    def done(self) -> bool:
        return self._stream.done

    def admitted(self, parsed: ParsedRequest) -> ParsedRequest:
        """After the key check: the chain must be the (now known) tenant's; the native
        body. Raises ApiError."""
        self.tenant = parsed.tenant
        prev = self.req.previous_response_id
        if prev is not None and not all(
            visible(r, self.tenant, self.api.wall()) for r in self.chain.values()
        ):
            raise _not_found(prev)
        if not self.native:
            return parsed
        salt = parsed.forward_body.get("cache_salt")
        body = native_body(self.req, self.history, salt if isinstance(salt, str) else None)
        return replace(parsed, forward_body=body, raw_body=b"")

    async def whole(self, status: int, body: bytes) -> tuple[int, bytes]:
        if status != 200:
            return status, body
        try:
            obj = jsonfast.loads(body)
            if self.native:
                if not isinstance(obj, dict):
                    raise ResponsesError(
                        "the engine's answer is not a response", None, "bad_upstream"
                    )
                response = patch_response(obj, self.req, self.resp_id, self.store)
                self.ctx.answered(_chat_equivalent(response))
            else:
                response = from_chat(self.req, self.resp_id, self.created_at, obj, store=self.store)
        except (ValueError, ResponsesError) as e:
            err = ApiError(
                502,
                f"the engine's answer could not be translated: {e}",
                None,
                "upstream_error",
                "server_error",
            )
            return 502, json.dumps(err.body()).encode()
        failure = await self._save(response)
        if failure is not None:
            return failure.status, json.dumps(failure.body()).encode()
        return 200, json.dumps(response).encode()

    def feed(self, chunk: bytes) -> bytes:
        return self._stream.feed(chunk)

    def fail(self, message: str) -> bytes:
        """The upstream stream broke: its error as a chat error event, translated."""
        evt = {
            "error": {
                "message": message,
                "type": "server_error",
                "param": None,
                "code": "upstream_error",
            }
        }
        return self._stream.feed(f"data: {json.dumps(evt)}\n\ndata: [DONE]\n\n".encode())

    async def end(self) -> bytes:
        """The last event, after the response is stored."""
        last = self._stream.final()
        if self.native:
            native = self._stream.response
            assert native is not None
            self.ctx.answered(_chat_equivalent(native))
        if not self.store or self.api.store is None:  # nothing to store: no object to build
            return last
        response = self._stream.response
        assert response is not None
        if response.get("status") == "failed":
            return last
        failure = await self._save(response)
        if failure is None:
            return last
        response.update(status="failed", error={"code": "store_failed", "message": failure.message})
        return final_event(response, self._stream.final_seq)

    async def _save(self, response: dict[str, Any]) -> ApiError | None:
        if not self.store or self.api.store is None:
            return None
        now = self.api.wall()
        row = StoredResponse(
            id=self.resp_id,
            tenant=self.tenant,
            model=self.req.model,
            created_at=now,
            expires_at=now + self.api.retention_s,
            previous_response_id=self.req.previous_response_id,
            input_items=self.req.items,
            output_items=tuple(it for it in response.get("output") or [] if isinstance(it, dict)),
            response=response,
        )
        try:
            await self.api.store.put(row)
        except Exception as e:  # the answer is kept from the client rather than half-stored
            log.warning("storing response %s failed: %r", self.resp_id, e)
            return ApiError(
                500,
                f"the response could not be stored ({type(e).__name__}); nothing else changed",
                None,
                "store_failed",
                "server_error",
            )
        return None


@dataclass
class ResponsesApi:
    """The Responses routes' state: the store (None = none), the mode, the retention."""

    store: ResponseStore | None = None
    native: bool = False
    retention_s: float = 30 * 86400.0
    max_chain: int = 1000
    wall: Callable[[], float] = time.time
    keys: bool = False
    """API keys on: the tenant of GET/DELETE is the key's."""

    async def parse(
        self,
        ctx: RequestContext,
        raw: bytes,
        parse: Callable[[Mapping[str, Any]], ParsedRequest],
        max_body_bytes: int,
    ) -> tuple[ParsedRequest, Turn]:
        """The ParsedRequest of one POST and its Turn; ``parse``: the gateway's
        ``parse_request`` of kind ``responses`` over a canonical chat body. Raises ApiError."""
        req = _request(raw, max_body_bytes)
        if self.store is None and (req.store or req.previous_response_id):
            what = "'store: true'" if req.store else "'previous_response_id'"
            raise ApiError(
                400,
                f"{what} needs stored responses, and this gateway has no store (set postgres_url)",
                "store" if req.store else "previous_response_id",
                "store_unavailable",
            )
        chain, history = await self._history(req)
        try:
            parsed = parse(chat_body(req, history))
        except ApiError as e:
            raise _renamed(e) from None
        store = req.store is not False and self.store is not None
        return parsed, Turn(self, ctx, req, history, chain, store)

    async def _history(
        self, req: ResponsesRequest
    ) -> tuple[Mapping[str, StoredResponse], list[dict[str, Any]]]:
        """The stored chain ``previous_response_id`` names and the context items rebuilt
        from it (none for a first turn). Raises ApiError (400 previous_response_not_found)."""
        prev = req.previous_response_id
        if prev is None or self.store is None:
            return {}, []
        now = self.wall()
        chain = await self.store.chain(prev, now, self.max_chain)
        # The tenant is checked after the key check (Turn.admitted); here the chain must
        # be whole and one tenant's.
        tenant = chain[prev].tenant if prev in chain else ""
        try:
            return chain, rebuild(chain, prev, tenant, now, self.max_chain)
        except ChainBroken:
            raise _not_found(prev) from None

    # -- routes, GET / DELETE, sweep --------------------------------------------------------
    def add_routes(self, router: web.UrlDispatcher, post: Handler) -> None:
        router.add_post("/v1/responses", post)
        router.add_get("/v1/responses/{id}", self.get)
        router.add_delete("/v1/responses/{id}", self.delete)
        router.add_get("/v1/responses/{id}/input_items", _not_implemented)

    def _tenant(self, request: web.Request) -> str:
        """The caller's tenant: its key's, else its header's."""
        if self.keys:
            return request[KEY_KEY].tenant
        return request.headers.get(H_TENANT, "")

    async def _visible(self, request: web.Request) -> StoredResponse | None:
        row = None
        if self.store is not None:
            row = await self.store.get(request.match_info["id"], self.wall())
        return row if visible(row, self._tenant(request), self.wall()) else None

    async def get(self, request: web.Request) -> web.StreamResponse:
        row = await self._visible(request)
        if row is None:
            return _missing(request.match_info["id"])
        return web.json_response(row.response)

    async def delete(self, request: web.Request) -> web.StreamResponse:
        row = await self._visible(request)
        if row is None or self.store is None:
            return _missing(request.match_info["id"])
        await self.store.delete(row.id, row.tenant)
        return web.json_response({"id": row.id, "object": "response", "deleted": True})

    @property
    def sweep_s(self) -> float:
        """How often expired responses are swept."""
        return min(60.0, self.retention_s)

    async def sweep(self) -> None:
        """Delete the expired stored responses (they are never served anyway)."""
        if self.store is not None:
            await self.store.sweep(self.wall())

    async def close(self) -> None:
        if self.store is not None:
            await self.store.close()


async def _not_implemented(request: web.Request) -> web.StreamResponse:
    e = ApiError(
        501,
        "GET /v1/responses/{id}/input_items is not implemented by this gateway",
        None,
        "not_implemented",
    )
    return web.json_response(e.body(), status=501)


def _missing(rid: str) -> web.Response:
    e = ApiError(404, f"Response with id '{rid}' not found.", None, "not_found")
    return web.json_response(e.body(), status=404)
