"""The engine simulator's agent APIs: Anthropic Messages (``/v1/messages``,
``/v1/messages/count_tokens``) and OpenAI Responses (``/v1/responses``, stateless) over its
chat path, their answers in the client's API (:class:`~services.engine.respond.Shape`)."""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable

from aiohttp import web

from services.common.apis.anthropic import error_body as anthropic_body
from services.common.apis.anthropic import from_openai_error
from services.common.apis.responses import (
    ResponsesError,
    chat_body,
    new_response_id,
    parse_responses,
)
from services.common.tokens import ChatError, TokenPath
from services.engine import api, respond
from services.engine.info_routes import bad_request

__all__ = ["AgentRoutes", "anthropic_error"]

Handle = Callable[..., Awaitable[web.StreamResponse]]
"""The server's one generation handler: ``handle(req, parse, body, shape)``."""


def anthropic_error(status: int, message: str) -> web.Response:
    return web.json_response(anthropic_body(status, message), status=status)


class AgentRoutes:
    """The agent API routes over the server's generation handler ``handle``."""

    def __init__(self, handle: Handle, tokens: TokenPath) -> None:
        self.handle, self.tokens = handle, tokens

    def add_to(self, r: web.UrlDispatcher) -> None:
        r.add_post("/v1/messages", self.messages)
        r.add_post("/v1/messages/count_tokens", self.count_tokens)
        r.add_post("/v1/responses", self.responses)

    async def messages(self, req: web.Request) -> web.StreamResponse:
        """Anthropic Messages over the chat path (:func:`api.messages_chat`)."""
        try:
            form = api.messages_chat(await req.json())
        except (json.JSONDecodeError, UnicodeDecodeError):
            return anthropic_error(400, "the request body is not valid JSON")
        except api.BadRequest as err:
            return anthropic_error(400, err.message)
        stop = form.body.get("stop") or []
        shape = respond.Messages(form.body["model"], tuple(stop))
        resp = await self.handle(req, api.parse_chat, form.body, shape)
        if resp.status >= 400 and isinstance(resp, web.Response):
            data = resp.body if isinstance(resp.body, bytes) else b""
            return web.json_response(from_openai_error(resp.status, data), status=resp.status)
        return resp

    async def count_tokens(self, req: web.Request) -> web.Response:
        """``{"input_tokens": N}`` of a Messages body, as ``/v1/messages`` renders it."""
        try:
            form = api.messages_chat(await req.json(), need_max_tokens=False)
            ids = self.tokens.encode_chat(form.body["messages"], form.body.get("tools"))
        except (json.JSONDecodeError, UnicodeDecodeError):
            return anthropic_error(400, "the request body is not valid JSON")
        except api.BadRequest as err:
            return anthropic_error(400, err.message)
        except ChatError as err:
            return anthropic_error(400, err.message)
        return web.json_response({"input_tokens": len(ids)})

    async def responses(self, req: web.Request) -> web.StreamResponse:
        """The Responses API over the chat path (stateless: no stored responses)."""
        try:
            rr = parse_responses(await req.json())
        except (json.JSONDecodeError, UnicodeDecodeError):
            return bad_request("the request body is not valid JSON", code="invalid_json")
        except ResponsesError as err:
            return bad_request(err.message, err.param, err.code)
        if rr.previous_response_id is not None:
            return bad_request(
                f"Previous response with id '{rr.previous_response_id}' not found: this engine "
                "stores no responses; send the whole context as input",
                "previous_response_id",
                "previous_response_not_found",
            )
        shape = respond.Responses(rr, new_response_id(), int(time.time()))
        return await self.handle(req, api.parse_chat, chat_body(rr), shape)
