"""A chat-completions SSE stream as Anthropic Messages stream events (pure, incremental).

:class:`StreamTranslator` is fed the upstream bytes as they come, cut anywhere (an event,
a line or a UTF-8 character may straddle two chunks), and returns the Anthropic events
ready to send:

- ``message_start`` (with ``usage.input_tokens`` as known then) and a ``ping``, at the
  first chat chunk;
- per content block: ``content_block_start``, its deltas (``text_delta``, or
  ``input_json_delta`` for a tool call's arguments as they stream) and
  ``content_block_stop``; a text block and each tool call (by its chat ``index``) are
  blocks in the order they begin;
- at ``data: [DONE]``: ``message_delta`` (stop reason, stop sequence and the final usage:
  OpenAI's usage arrives in the finish chunk or a trailing usage-only chunk, so it is sent
  once the stream is complete) and ``message_stop``.

An OpenAI error event in the stream becomes an Anthropic ``error`` event. :meth:`fail`
gives the ``error`` event for a stream that broke (see the relay).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from services.common import jsonfast
from services.common.apis.anthropic import error_body
from services.common.apis.anthropic_answer import chat_usage, stop_of
from services.common.apis.chat_chunks import ChunkFacts, TextChunks, not_plain

__all__ = ["StreamTranslator", "sse_event"]

_MAX_CARRY = 8 << 20  # an unterminated line longer than this is dropped


def sse_event(name: str, data: dict[str, Any]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + jsonfast.dumps(data) + b"\n\n"


_TEXT_DELTA = (
    b'event: content_block_delta\ndata: {"type":"content_block_delta","index":%d,'
    b'"delta":{"type":"text_delta","text":%b}}\n\n'
)
"""A text delta event (the bytes :func:`sse_event` writes): the block's index, the text
encoded."""

_PING = b'event: ping\ndata: {"type":"ping"}\n\n'
_STOP = b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
_BLOCK_STOP = b'event: content_block_stop\ndata: {"type":"content_block_stop","index":%d}\n\n'
_TEXT_START = (
    b'event: content_block_start\ndata: {"type":"content_block_start","index":%d,'
    b'"content_block":{"type":"text","text":""}}\n\n'
)
"""Events with nothing to encode but an index, as :func:`sse_event` writes them."""

_MESSAGE_START = (
    b'event: message_start\ndata: {"type":"message_start","message":{"id":%b,"type":"message",'
    b'"role":"assistant","model":%b,"content":[],"stop_reason":null,"stop_sequence":null,'
    b'"usage":{"input_tokens":%b,"output_tokens":0}}}\n\n'
)
"""``message_start`` as :func:`sse_event` writes it: the encoded id, model and prompt size."""

_MESSAGE_DELTA = (
    b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"%b",'
    b'"stop_sequence":%b},"usage":%b}\n\n'
)
"""``message_delta`` as :func:`sse_event` writes it: the stop reason (one of
:func:`~.anthropic_answer.stop_of`'s, no escapes), the encoded stop sequence and usage."""


class StreamTranslator:
    """One stream's translation state (see the module doc). ``model``: the name the client
    asked for; ``input_tokens``: the prompt's size for ``message_start`` (the engine's own
    count follows in ``message_delta``)."""

    end = b"[DONE]"
    """What ends the upstream (chat) stream."""

    def __init__(
        self, *, model: str, stop_sequences: Sequence[str] = (), input_tokens: int = 0
    ) -> None:
        self.model = model
        self.stop_sequences = tuple(stop_sequences)
        self.input_tokens = input_tokens
        self.started = False
        self.finished = False
        self._carry = b""
        self._block = -1  # index of the open block (-1: none)
        self._blocks = 0
        self._text_open = False
        self._tools: dict[int, int] = {}  # chat tool index -> block index
        self._open_tool: int | None = None
        self._finish: Any = None
        self._stop_reason: Any = None
        self._usage: Any = None
        self.facts = ChunkFacts()  # for the request record
        self._texts = TextChunks()
        self._saw_calls = False

    def feed(self, chunk: bytes) -> bytes:
        """The Anthropic events the stream's bytes so far complete."""
        lines = (self._carry + chunk if self._carry else chunk).split(b"\n")
        self._carry = lines.pop()
        if len(self._carry) > _MAX_CARRY:
            self._carry = b""
        out: list[bytes] = []
        for raw in lines:
            line = raw.strip()
            if line.startswith(b"data:"):
                out.append(self._data(line[5:].strip()))
        return b"".join(out)

    def final(self) -> bytes:
        """Bytes after the chat stream's end: none (``message_stop`` came with ``[DONE]``)."""
        return b""

    def fail(self, message: str) -> bytes:
        """The ``error`` event ending a broken stream."""
        self.finished = True
        return sse_event("error", error_body(502, message))

    # -- events ---------------------------------------------------------------------------
    def _data(self, payload: bytes) -> bytes:
        if self.finished or not payload:
            return b""
        if payload == b"[DONE]":
            return self._done()
        text = self._texts.text(payload)
        if text is not None:  # the usual chunk (started: it was learnt), as _choice writes it
            return self._text(text[0])
        try:  # orjson directly: jsonfast.loads' fallback only for what orjson refuses
            obj = orjson.loads(payload)
        except orjson.JSONDecodeError:
            try:
                obj = jsonfast.loads(payload)
            except (ValueError, UnicodeDecodeError):
                return b""
        if not isinstance(obj, dict):
            return b""
        head = b"" if self.started else self._start(obj)
        choices = obj.get("choices")
        kept = not_plain(obj, choices)  # the record may need it (chat_chunks.ChunkFacts)
        if kept:
            self.facts.kept(obj)  # what the record needs of it
            special = self._special(obj)
            if special is not None:
                return head + special
        choice = choices[0] if isinstance(choices, list) and choices else None
        if not isinstance(choice, dict):
            return head
        delta = choice.get("delta")
        if not kept and isinstance(delta, dict) and delta.get("tool_calls"):
            self.facts.kept(obj)
        if (  # the usual chunk: one more piece of the open text block
            self._text_open
            and isinstance(delta, dict)
            and len(delta) == 1
            and choice.get("finish_reason") is None
        ):
            text = delta.get("content")
            if isinstance(text, str) and text:
                if not kept:
                    self._texts.learn(payload, obj, text)
                return head + _TEXT_DELTA % (self._block, jsonfast.dumps(text))
        return head + self._choice(choice)

    def _special(self, obj: dict[str, Any]) -> bytes | None:
        """A chunk's error event (the stream ends there), or None after taking its usage."""
        err = obj.get("error")
        if err is not None:
            self.finished = True
            msg = err.get("message") if isinstance(err, dict) else str(err)
            return sse_event("error", error_body(502, str(msg or "upstream error")))
        usage = obj.get("usage")
        if usage is not None:
            self._usage = usage
        return None

    def _start(self, obj: dict[str, Any]) -> bytes:
        self.started = True
        cid = obj.get("id")
        mid = f"msg_{cid}" if isinstance(cid, str) and cid else "msg_0"
        dumps = jsonfast.dumps
        return _MESSAGE_START % (dumps(mid), dumps(self.model), dumps(self.input_tokens)) + _PING

    def _choice(self, choice: dict[str, Any]) -> bytes:
        out: list[bytes] = []
        delta = choice.get("delta")
        if isinstance(delta, dict):
            text = delta.get("content")
            if isinstance(text, str) and text:
                out.append(self._text(jsonfast.dumps(text)))
            calls = delta.get("tool_calls")
            for c in calls if isinstance(calls, list) else []:
                if isinstance(c, dict):
                    out.append(self._tool(c))
        if choice.get("finish_reason") is not None:
            self._finish = choice["finish_reason"]
            self._stop_reason = choice.get("stop_reason")
        return b"".join(out)

    def _close(self) -> bytes:
        if self._block < 0:
            return b""
        i, self._block = self._block, -1
        self._text_open = False
        self._open_tool = None
        return _BLOCK_STOP % i

    def _open(self, block: dict[str, Any] | None) -> bytes:
        """Open a block: ``block``, or a text block (None)."""
        out = self._close()
        self._block = self._blocks
        self._blocks += 1
        if block is None:
            return out + _TEXT_START % self._block
        return out + sse_event(
            "content_block_start",
            {"type": "content_block_start", "index": self._block, "content_block": block},
        )

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return sse_event(
            "content_block_delta",
            {"type": "content_block_delta", "index": self._block, "delta": delta},
        )

    def _text(self, encoded: bytes) -> bytes:
        """A text delta (``encoded``: the text as JSON), opening a text block when none is."""
        if self._text_open:
            return _TEXT_DELTA % (self._block, encoded)
        out = self._open(None)
        self._text_open = True
        return out + _TEXT_DELTA % (self._block, encoded)

    def _tool(self, call: dict[str, Any]) -> bytes:
        idx = call.get("index")
        idx = idx if isinstance(idx, int) else 0
        fn = call.get("function")
        fn = fn if isinstance(fn, dict) else {}
        out = b""
        if idx not in self._tools:
            self._saw_calls = True
            tid = call.get("id")
            block = {
                "type": "tool_use",
                "id": tid if isinstance(tid, str) and tid else f"toolu_{idx}",
                "name": str(fn.get("name") or ""),
                "input": {},
            }
            out = self._open(block)
            self._tools[idx] = self._block
            self._open_tool = idx
        elif self._open_tool != idx:
            return b""  # a fragment of a call whose block is closed: Anthropic cannot reopen
        args = fn.get("arguments")
        if isinstance(args, str) and args:
            out += self._delta({"type": "input_json_delta", "partial_json": args})
        return out

    def _done(self) -> bytes:
        out = [] if self.started else [self._start({})]
        self.finished = True
        out.append(self._close())
        reason, seq = stop_of(self._finish, self._stop_reason, self.stop_sequences, self._saw_calls)
        usage: dict[str, int] = chat_usage(self._usage)
        if self._usage is None:
            usage = {"input_tokens": self.input_tokens, "output_tokens": 0}
        out.append(_MESSAGE_DELTA % (reason.encode(), jsonfast.dumps(seq), jsonfast.dumps(usage)))
        out.append(_STOP)
        return b"".join(out)
