"""The Anthropic Messages routes of the gateway: their error shape and answer shapes.

``POST /v1/messages`` goes through the same intake as chat
(:func:`~services.scheduler.http.openai.parse_request` with kind ``messages``: its canonical
chat body is what is tokenized, admitted and routed). Forwarding depends on
``native_apis``:

- ``messages`` in it (the engines serve ``/v1/messages``, as vLLM does): the client's body
  goes to the engine's ``/v1/messages`` and its answer is relayed as it is;
- otherwise: the canonical chat body goes to ``/v1/chat/completions`` and the answer is
  translated back (:func:`~services.common.apis.anthropic.to_message`, and for streams
  :class:`~services.common.apis.anthropic_stream.StreamTranslator`).

A disaggregated pick always takes the chat path (the P/D flows are chat's).

``POST /v1/messages/count_tokens`` answers ``{"input_tokens": N}`` from the same
tokenization (:func:`count_tokens`).

The error shape is a property of the route: :func:`anthropic_errors` (the outermost
middleware) answers every error on :data:`PATHS`, the gateway's own refusals included
(validation 400/404/413, 401/403 keys, 429 admission, 503 no engine, 502 upstream, 500),
as ``{"type": "error", "error": {"type", "message"}}`` with the status's Anthropic type.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from services.common import jsonfast
from services.common.apis.anthropic import MessagesError, from_openai_error, to_chat, to_message
from services.common.apis.anthropic import error_body as anthropic_error
from services.common.apis.anthropic_stream import StreamTranslator, sse_event
from services.common.tokens import ChatError, TokenPath
from services.scheduler.http.openai import ApiError, Limits, ParsedRequest

__all__ = [
    "COUNT_PATH",
    "PATH",
    "PATHS",
    "AnswerShape",
    "Passthrough",
    "answer_shape",
    "anthropic_errors",
    "count_tokens",
]

PATH = "/v1/messages"
COUNT_PATH = "/v1/messages/count_tokens"
PATHS = frozenset({PATH, COUNT_PATH})

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def anthropic_errors(paths: Collection[str] = PATHS) -> Any:
    """The middleware giving every error answer on ``paths`` Anthropic's shape (status and
    headers such as ``Retry-After`` kept)."""
    wanted = frozenset(paths)

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        resp = await handler(request)
        if request.path not in wanted or resp.status < 400 or not isinstance(resp, web.Response):
            return resp
        data = resp.body if isinstance(resp.body, bytes) else b""
        out = web.json_response(from_openai_error(resp.status, data), status=resp.status)
        for name, value in resp.headers.items():
            if name.lower() not in ("content-type", "content-length"):
                out.headers[name] = value
        return out

    return middleware


class Passthrough:
    """A native engine's Messages stream, relayed as it is (it ends with ``message_stop``;
    a broken one gets an Anthropic ``error`` event)."""

    end = b"message_stop"

    def feed(self, chunk: bytes) -> bytes:
        return chunk

    def fail(self, message: str) -> bytes:
        return sse_event("error", anthropic_error(502, message))


@dataclass(frozen=True, slots=True)
class AnswerShape:
    """How a Messages request's answer reaches the client: as it is (``native``) or
    translated from chat (the client's ``model`` name, its stop sequences, its prompt size
    for ``message_start``)."""

    native: bool
    model: str
    stop_sequences: tuple[str, ...] = ()
    input_tokens: int = 0

    def whole(self, status: int, data: bytes) -> bytes:
        if self.native or status != 200:
            return data  # errors: anthropic_errors reshapes them
        try:
            chat = jsonfast.loads(data)
        except (ValueError, UnicodeDecodeError):
            chat = None
        return jsonfast.dumps(
            to_message(chat, model=self.model, stop_sequences=self.stop_sequences)
        )

    def stream(self) -> Passthrough | StreamTranslator:
        if self.native:
            return Passthrough()
        return StreamTranslator(
            model=self.model, stop_sequences=self.stop_sequences, input_tokens=self.input_tokens
        )


def answer_shape(p: ParsedRequest, native: bool) -> AnswerShape | None:
    """The answer shape of a Messages request (None for the other APIs)."""
    if p.kind != "messages":
        return None
    stop = p.forward_body.get("stop")
    stops = tuple(s for s in stop if isinstance(s, str)) if isinstance(stop, list) else ()
    return AnswerShape(native, p.model, stops, len(p.prompt_ids))


def count_tokens(
    raw: bytes,
    *,
    models: Collection[str],
    limits: Limits,
    tokens: TokenPath,
) -> int:
    """The prompt tokens of a ``count_tokens`` body (a Messages body without
    ``max_tokens``), rendered as ``/v1/messages`` renders it. Raises :class:`ApiError`."""
    if len(raw) > limits.max_body_bytes:
        raise ApiError(413, f"request body over {limits.max_body_bytes} bytes", None, "too_large")
    try:
        body = jsonfast.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise ApiError(400, f"invalid JSON body: {e}", None, "invalid_json") from None
    try:
        form = to_chat(body, need_max_tokens=False)
    except MessagesError as e:
        raise ApiError(e.status, e.message, e.param) from None
    chat: Mapping[str, Any] = form.body
    if models and chat["model"] not in models:
        raise ApiError(404, f"model {chat['model']!r} does not exist", "model", "model_not_found")
    msgs = chat["messages"]
    if len(msgs) > limits.max_messages:
        raise ApiError(400, f"{len(msgs)} messages is over the limit of {limits.max_messages}")
    try:
        return len(tokens.encode_chat(msgs, chat.get("tools")))
    except ChatError as e:
        raise ApiError(400, e.message, e.param, e.code) from None
