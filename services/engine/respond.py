"""Turning a request's token outputs into HTTP answers: one JSON body, or SSE chunks.

Coalescing: tokens are sent ``interval`` at a time (SGLang's ``--stream-interval``); outputs
queued together are handled as one group. OpenAI streams carry text deltas and always put
``usage`` in the chunk with ``finish_reason``; SGLang ``/generate`` streams carry cumulative
``text``/``output_ids`` with ``meta_info``. The die-mid-stream fault aborts the transport.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn, Protocol

from aiohttp import web

from services.common.apis.anthropic_answer import to_message
from services.common.apis.anthropic_stream import StreamTranslator
from services.common.apis.responses import ResponsesRequest
from services.common.apis.responses_answer import from_chat
from services.common.apis.responses_stream import ChatToResponses
from services.common.engine_core.core import SeqOutput
from services.engine import api

__all__ = ["Live", "Messages", "Responses", "Shape", "StreamShape", "outputs", "stream", "unary"]

log = logging.getLogger(__name__)


@dataclass
class Live:
    """A request in flight in the shell; the stepping loop feeds ``queue``."""

    rid: str
    gen: api.GenRequest
    arrival_ms: float
    queue: asyncio.Queue[SeqOutput] = field(default_factory=asyncio.Queue)
    first_ms: float | None = None
    last_ms: float = 0.0
    done: bool = False
    kv: dict[str, Any] = field(default_factory=dict)  # the decode's KV pull, usage fields


class StreamShape(Protocol):
    """A chat SSE stream in another API's events: ``feed`` each chunk, then ``final``."""

    def feed(self, chunk: bytes) -> bytes: ...

    def final(self) -> bytes: ...


class Shape(Protocol):
    """A chat answer in another API's shape (the simulator serving ``/v1/messages`` and
    ``/v1/responses`` over its chat path)."""

    def whole(self, chat: dict[str, Any]) -> dict[str, Any]: ...

    def stream(self, input_tokens: int) -> StreamShape: ...


@dataclass(frozen=True)
class Messages:
    """A chat answer sent as an Anthropic Messages answer (the client's ``model`` name and
    its ``stop_sequences``)."""

    model: str
    stop_sequences: tuple[str, ...] = ()

    def whole(self, chat: dict[str, Any]) -> dict[str, Any]:
        return to_message(chat, model=self.model, stop_sequences=self.stop_sequences)

    def stream(self, input_tokens: int) -> StreamTranslator:
        return StreamTranslator(
            model=self.model, stop_sequences=self.stop_sequences, input_tokens=input_tokens
        )


@dataclass(frozen=True)
class Responses:
    """A chat answer sent as an OpenAI Responses answer (stateless: nothing stored)."""

    req: ResponsesRequest
    resp_id: str
    created_at: int

    def whole(self, chat: dict[str, Any]) -> dict[str, Any]:
        return from_chat(self.req, self.resp_id, self.created_at, chat, store=False)

    def stream(self, input_tokens: int) -> ChatToResponses:
        return ChatToResponses(self.req, self.resp_id, self.created_at, store=False)


async def outputs(live: Live) -> AsyncIterator[list[SeqOutput]]:
    """Groups of outputs as they arrive (everything queued at once is one group)."""
    while True:
        group = [await live.queue.get()]
        while not live.queue.empty():
            group.append(live.queue.get_nowait())
        yield group
        if group[-1].finished:
            return


def die(req: web.Request, live: Live) -> NoReturn:
    log.info("fault: closing request %s abruptly", live.rid)
    if req.transport is not None:
        req.transport.abort()
    raise ConnectionResetError("fault injected: died mid-stream")


async def unary(
    req: web.Request,
    live: Live,
    model: str,
    die_after: int,
    extra: Callable[[], Mapping[str, Any] | None] | None = None,
    shape: Shape | None = None,
) -> web.StreamResponse:
    """The whole answer as one JSON body (``die_after`` > 0: close abruptly after N tokens);
    the top-level fields ``extra()`` returns once the request is done are added to it (e.g.
    ``kv_transfer_params``, which name the blocks the prompt now holds). ``responses``: a
    Responses API request, answered as a ``response`` object."""
    tokens: list[int] = []
    last: SeqOutput | None = None
    async for group in outputs(live):
        for out in group:
            tokens.extend(out.tokens)
            last = out
        if die_after and len(tokens) >= die_after:
            die(req, live)
    assert last is not None
    g = live.gen
    use = api.usage(len(g.prompt_ids), len(tokens), last.cached_tokens, live.kv)
    text = api.render(tokens, False)
    if g.kind == "chat":
        body = api.chat_response("chatcmpl-" + live.rid, model, text, use)
    elif g.kind == "completion":
        body = api.completion_response("cmpl-" + live.rid, model, text, use)
    else:
        body = {"text": text, "output_ids": tokens, "meta_info": meta(live, last, len(tokens))}
    body = {**body, **((extra() if extra else None) or {})}
    return web.json_response(shape.whole(body) if shape is not None else body)


def meta(live: Live, last: SeqOutput, n: int) -> dict[str, Any]:
    return {
        "id": live.rid,
        "finish_reason": {"type": "length", "length": n} if last.finished else None,
        "prompt_tokens": len(live.gen.prompt_ids),
        "completion_tokens": n,
        "cached_tokens": last.cached_tokens,
        "e2e_latency": (live.last_ms - live.arrival_ms) / 1000.0,
        **live.kv,
    }


async def stream(
    req: web.Request,
    live: Live,
    model: str,
    interval: int,
    die_after: int,
    shape: Shape | None = None,
) -> web.StreamResponse:
    """SSE: one chunk per ``interval`` tokens (and the last), usage in the final chunk, an
    extra usage-only chunk when asked, then ``data: [DONE]`` (``shape``: all of it as
    another API's events, Anthropic Messages or OpenAI Responses)."""
    resp = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await resp.prepare(req)
    g = live.gen
    cid = ("chatcmpl-" if g.kind == "chat" else "cmpl-") + live.rid
    sent: list[int] = []
    buf: list[int] = []
    last: SeqOutput | None = None

    translator = shape.stream(len(g.prompt_ids)) if shape is not None else None

    async def write(data: bytes) -> None:
        await resp.write(translator.feed(data) if translator is not None else data)

    async def send(obj: dict[str, Any]) -> None:
        await write(b"data: " + json.dumps(obj).encode() + b"\n\n")

    async for group in outputs(live):
        for out in group:
            buf.extend(out.tokens)
            last = out
        assert last is not None
        if die_after and len(sent) + len(buf) >= die_after:
            buf = buf[: die_after - len(sent)]
            if buf:
                await send(chunk(g, cid, model, live, last, sent, buf, final=False))
            die(req, live)
        if len(buf) < interval and not last.finished:
            continue
        await send(chunk(g, cid, model, live, last, sent, buf, final=last.finished))
        sent.extend(buf)
        buf = []
    assert last is not None
    if g.include_usage and g.kind != "generate":
        use = api.usage(len(g.prompt_ids), len(sent), last.cached_tokens, live.kv)
        if g.kind == "chat":
            empty = api.chat_chunk(cid, model, None, None, use)
        else:
            empty = api.completion_chunk(cid, model, "", None, use)
        empty["choices"] = []
        await send(empty)
    await write(b"data: [DONE]\n\n")
    if translator is not None:
        await resp.write(translator.final())
    await resp.write_eof()
    return resp


def chunk(
    g: api.GenRequest,
    cid: str,
    model: str,
    live: Live,
    last: SeqOutput,
    sent: list[int],
    new: list[int],
    *,
    final: bool,
) -> dict[str, Any]:
    finish = "length" if final else None
    use = (
        api.usage(len(g.prompt_ids), len(sent) + len(new), last.cached_tokens, live.kv)
        if final
        else None
    )
    if g.kind == "generate":
        ids = sent + new
        return {
            "text": api.render(ids, False),
            "output_ids": ids,
            "meta_info": meta(live, last, len(ids)),
            "index": 0,
        }
    delta = api.render(new, bool(sent))
    if g.kind == "chat":
        return api.chat_chunk(cid, model, delta, finish, use, first=not sent)
    return api.completion_chunk(cid, model, delta, finish, use)
