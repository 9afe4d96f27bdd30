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
from typing import Any

from aiohttp import web

from services.common import jsonfast
from services.common.apis.anthropic import MessagesError, from_openai_error, to_chat
from services.common.apis.anthropic import error_body as anthropic_error
from services.common.apis.anthropic_answer import to_message
from services.common.apis.anthropic_stream import StreamTranslator, sse_event
from services.common.tokens import ChatError, TokenPath
from services.scheduler.core.records import RequestContext
from services.scheduler.http.openai import ApiError, Limits, ParsedRequest, json_body

__all__ = [
    "COUNT_PATH",
    "PATH",
    "PATHS",
    "MessagesAnswer",
    "anthropic_errors",
    "count_tokens",
    "messages_answer",
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


class MessagesAnswer:
    """How a Messages request's answer reaches the client (the relay's
    :class:`~services.scheduler.http.relay.AnswerTranslator`): as the engine sent it
    (``native``: the engine's ``/v1/messages``; a broken stream gets an Anthropic ``error``
    event) or translated from chat completions (the client's ``model`` name, its stop
    sequences, its prompt size for ``message_start``). Translated with ``ctx``: the request
    record reads the chunks the translator parsed, not the bytes again."""

    def __init__(
        self,
        native: bool,
        model: str,
        stop_sequences: tuple[str, ...] = (),
        input_tokens: int = 0,
        ctx: RequestContext | None = None,
    ) -> None:
        self.native, self.model = native, model
        self.stop_sequences, self.input_tokens = stop_sequences, input_tokens
        self.path = PATH if native else "/v1/chat/completions"
        self._end = b"message_stop" if native else b"[DONE]"
        self._tail = b""
        self._stream: StreamTranslator | None = None
        if not native:
            self._stream = StreamTranslator(
                model=model, stop_sequences=stop_sequences, input_tokens=input_tokens
            )
            if ctx is not None:  # it parses every chunk: the record's facts come from it
                ctx.facts = self._stream.facts

    @property
    def done(self) -> bool:
        return self._end in self._tail

    async def whole(self, status: int, body: bytes) -> tuple[int, bytes]:
        if self.native or status != 200:
            return status, body  # errors: anthropic_errors reshapes them
        try:
            chat = jsonfast.loads(body)
        except (ValueError, UnicodeDecodeError):
            chat = None
        return status, jsonfast.dumps(
            to_message(chat, model=self.model, stop_sequences=self.stop_sequences)
        )

    def feed(self, chunk: bytes) -> bytes:
        self._tail = (self._tail + chunk)[-64:]
        return chunk if self._stream is None else self._stream.feed(chunk)

    def fail(self, message: str) -> bytes:
        if self._stream is None:
            return sse_event("error", anthropic_error(502, message))
        return self._stream.fail(message)

    async def end(self) -> bytes:
        return b""


def messages_answer(
    p: ParsedRequest, native: bool, ctx: RequestContext | None = None
) -> MessagesAnswer | None:
    """The answer translator of a Messages request (None for the other APIs)."""
    if p.kind != "messages":
        return None
    stop = p.forward_body.get("stop")
    stops = tuple(s for s in stop if isinstance(s, str)) if isinstance(stop, list) else ()
    return MessagesAnswer(native, p.model, stops, len(p.prompt_ids), ctx)


def count_tokens(
    raw: bytes,
    *,
    models: Collection[str],
    limits: Limits,
    tokens: TokenPath,
) -> int:
    """The prompt tokens of a ``count_tokens`` body (a Messages body without
    ``max_tokens``), rendered as ``/v1/messages`` renders it. Raises :class:`ApiError`."""
    body = json_body(raw, limits.max_body_bytes)
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
