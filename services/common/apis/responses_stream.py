"""Responses API streams (pure, incremental: fed raw bytes at any chunk boundary).

:class:`ChatToResponses` turns a chat-completions SSE stream into the Responses events
OpenAI sends, each ``event: <type>`` + ``data: <json>`` with a ``sequence_number`` from 0:
``response.created``, ``response.in_progress``; per output item
``response.output_item.added``, then for a message ``response.content_part.added``,
``response.output_text.delta``..., ``response.output_text.done``,
``response.content_part.done``, and for a tool call
``response.function_call_arguments.delta``..., ``response.function_call_arguments.done``;
``response.output_item.done``; last ``response.completed`` (or ``response.incomplete`` when
the answer stopped on length, ``response.failed`` after an error), with the whole response.

The last event is held back: :meth:`~ChatToResponses.feed` returns everything before it and
:meth:`~ChatToResponses.final` the last one, so the caller can store the response before
the client sees it done (and may send the next turn to another replica).

An engine's own Responses stream passed through is :mod:`.responses_native`'s.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import orjson

from services.common import jsonfast
from services.common.apis.chat_chunks import ChunkFacts, TextChunks, not_plain
from services.common.apis.responses import Item, ResponsesRequest
from services.common.apis.responses_answer import (
    ResponseBytes,
    final_status,
    function_item,
    response_object,
    response_usage,
)

__all__ = ["ChatToResponses", "final_event", "sse_events"]


def sse_events(buf: bytearray) -> Iterator[tuple[str, str]]:
    """Complete SSE events taken off the front of ``buf``: (event name, data)."""
    while True:
        end = buf.find(b"\n\n")
        if end < 0:
            return
        raw = bytes(buf[:end]).decode("utf-8", "replace")
        del buf[: end + 2]
        name, data = "", []
        for line in raw.split("\n"):
            line = line.rstrip("\r")
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].lstrip())
        if data:
            yield name, "\n".join(data)


_MAX_CARRY = 8 << 20  # an unterminated line longer than this is dropped


def _event(kind: str, seq: int, fields: Mapping[str, Any]) -> bytes:
    obj = {"type": kind, "sequence_number": seq, **fields}
    return b"event: " + kind.encode() + b"\ndata: " + jsonfast.dumps(obj) + b"\n\n"


_TEXT_DELTA = (
    b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta",'
    b'"sequence_number":%d%b%b,"logprobs":[]}\n\n'
)
"""A text delta event: its number, the open item's ``_delta_head`` and the encoded text."""


_MESSAGE_ADDED = (
    b'event: response.output_item.added\ndata: {"type":"response.output_item.added",'
    b'"sequence_number":%d,"output_index":%d,"item":{"id":%b,"type":"message",'
    b'"status":"in_progress","role":"assistant","content":[]}}\n\n'
)
"""A message item opened: its number, output index and encoded id (message_item's keys)."""

_PART_ADDED = (
    b'%b,"content_index":0,"part":{"type":"output_text","annotations":[],"logprobs":[],"text":""}'
)
"""The fields of a message's ``response.content_part.added``: after the open item's ids."""

_MESSAGE_DONE = (
    b'{"id":%b,"type":"message","status":"completed","role":"assistant","content":'
    b'[{"type":"output_text","annotations":[],"logprobs":[],"text":%b}]}'
)
"""A completed message item (message_item's keys; the part's as the events write them): its
encoded id and text."""


def _raw_event(kind: bytes, seq: int, rest: bytes) -> bytes:
    """``_event`` with its fields already encoded: ``rest`` is their JSON without braces."""
    return b'event: %b\ndata: {"type":"%b","sequence_number":%d,%b}\n\n' % (kind, kind, seq, rest)


_FINAL_KIND = {"failed": b"response.failed", "incomplete": b"response.incomplete"}


def _final_kind(status: object) -> bytes:
    """The last event's type after the response's status."""
    return _FINAL_KIND.get(str(status), b"response.completed")


def final_event(response: Mapping[str, Any], seq: int) -> bytes:
    """The last event of a stream: ``response.completed``, ``.incomplete`` or ``.failed``
    after the response's status."""
    return _raw_event(
        _final_kind(response.get("status")), seq, b'"response":' + jsonfast.dumps(response)
    )


class ChatToResponses:
    """One chat SSE stream as Responses events (see the module doc). ``response`` is the
    final response object once the stream ended (None before).

    Per streamed token this is the gateway's hot path, so the chat stream is read as lines
    of bytes (chat streams carry one ``data:`` line per event), the usual chunk is read
    without parsing it (:class:`~.chat_chunks.TextChunks`), the delta events are written
    from templates, and the response objects from what the request fixes, encoded once
    (:class:`~.responses_answer.ResponseBytes`), with each message item encoded when it
    closes; the bytes are those :func:`_event` would write, and ``response`` is built only
    when asked for (to be stored)."""

    def __init__(self, req: ResponsesRequest, resp_id: str, created_at: int, store: bool) -> None:
        self.req, self.resp_id, self.created_at, self.store = req, resp_id, created_at, store
        self._base = resp_id.removeprefix("resp_")
        self._carry = b""
        self._seq = 0
        self._out: list[bytes] = []
        self._items: list[Item] = []
        self._open: int | None = None  # output index of the open item
        self._open_id = b""  # the open item's id, encoded
        self._open_ids = b""  # '"item_id":...,"output_index":N' of the open item
        self._delta_head = b""  # an open message's text delta event up to its text
        self._parts: list[str] = []  # the open item's text or arguments so far
        self._tools: dict[int, int] = {}  # chat tool index -> output index
        self.usage: dict[str, Any] | None = None
        self.facts = ChunkFacts()  # for the request record
        self._texts = TextChunks()
        self.finish: str | None = None
        self.error: dict[str, Any] | None = None
        self.done = False
        self.status = ""  # the final response's, once the stream ended
        self._bytes = ResponseBytes(req, resp_id, created_at, store)
        self._encoded: dict[int, bytes] = {}  # output index -> a closed message item's JSON
        self._response: dict[str, Any] | None = None

    @property
    def response(self) -> dict[str, Any] | None:
        """The final response object (None before the stream ended)."""
        if self._response is None and self.done:
            self._response = response_object(
                self.req, self.resp_id, self.created_at, output=self._items, usage=self.usage,
                finish_reason=self.finish, status=self.status, error=self.error,
                store=self.store,
            )  # fmt: skip
        return self._response

    def _emit(self, kind: str, **fields: Any) -> None:
        self._out.append(_event(kind, self._seq, fields))
        self._seq += 1

    def _emit_raw(self, kind: bytes, rest: bytes) -> None:
        self._out.append(_raw_event(kind, self._seq, rest))
        self._seq += 1

    def _start(self) -> None:
        rest = b'"response":' + self._bytes.encode("in_progress", b"[]")
        self._emit_raw(b"response.created", rest)
        self._emit_raw(b"response.in_progress", rest)

    def feed(self, data: bytes) -> bytes:
        """The Responses events ``data`` completes (the last one held back)."""
        if self._seq == 0:
            self._start()
        lines = (self._carry + data if self._carry else data).split(b"\n")
        self._carry = lines.pop()
        if len(self._carry) > _MAX_CARRY:
            self._carry = b""
        for raw in lines:
            if not raw:  # the blank line that ends each event
                continue
            if self.done:
                break
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                self._end()
                continue
            text = self._texts.text(payload)
            if text is not None:  # the usual chunk, not parsed: as _chunk writes it
                self._text_delta(*text)
                continue
            try:  # orjson directly: jsonfast.loads' fallback only for what orjson refuses
                obj = orjson.loads(payload)
            except orjson.JSONDecodeError:
                try:
                    obj = jsonfast.loads(payload)
                except ValueError:
                    continue
            if isinstance(obj, dict):
                self._chunk(obj, payload)
        out, self._out = b"".join(self._out), []
        return out

    def _chunk(self, obj: dict[str, Any], payload: bytes) -> None:
        choices = obj.get("choices")
        kept = not_plain(obj, choices)  # the record may need it (chat_chunks.ChunkFacts)
        if kept:
            self.facts.kept(obj)  # what the record needs of it
            if self._special(obj):
                return
        if not isinstance(choices, list) or not choices:
            return
        choice = choices[0]
        if not isinstance(choice, dict):
            return
        delta = choice.get("delta")  # parsed JSON: an object is a dict
        if isinstance(delta, dict):
            text = delta.get("content")
            if text and isinstance(text, str):
                self._text_delta(jsonfast.dumps(text), text)
                if not kept and len(delta) == 1 and choice.get("finish_reason") is None:
                    self._texts.learn(payload, obj, text)
                    return
            calls = delta.get("tool_calls")
            if calls:
                if not kept:
                    self.facts.kept(obj)
                for tc in calls:
                    if isinstance(tc, dict):
                        self._tool(tc)
        if choice.get("finish_reason"):
            self.finish = str(choice["finish_reason"])

    def _text_delta(self, encoded: bytes, text: str) -> None:
        """A text delta (``encoded``: ``text`` as JSON), opening a message when none is."""
        if not self._delta_head:  # no message is open
            self._open_message()
        self._parts.append(text)
        self._out.append(_TEXT_DELTA % (self._seq, self._delta_head, encoded))
        self._seq += 1

    def _special(self, obj: dict[str, Any]) -> bool:
        """A chunk's error (True: the stream ends here) or usage."""
        err = obj.get("error")
        if isinstance(err, dict):
            self.error = {
                "code": str(err.get("code") or "server_error"),
                "message": str(err.get("message") or ""),
            }
            self._emit(
                "error",
                code=self.error["code"],
                message=self.error["message"],
                param=err.get("param"),
            )
            self._end()
            return True
        usage = obj.get("usage")
        if usage is not None:
            self.usage = response_usage(usage)
        return False

    def _opened(self, at: int, item_id: str, message: bool) -> None:
        self._open, self._parts = at, []
        self._open_id = jsonfast.dumps(item_id)
        self._open_ids = b'"item_id":%b,"output_index":%d' % (self._open_id, at)
        self._delta_head = b',%b,"content_index":0,"delta":' % self._open_ids if message else b""

    def _open_message(self) -> None:
        """Open a message item (closing the open tool call, if any) for text deltas."""
        self._close()
        at = len(self._items)
        item_id = f"msg_{self._base}" + (f"_{at}" if at else "")
        # message_item's keys in its order; the part's as the events write them
        part = {"type": "output_text", "annotations": [], "logprobs": [], "text": ""}
        item: Item = {
            "id": item_id,
            "type": "message",
            "status": "in_progress",
            "role": "assistant",
            "content": [part],
        }
        self._items.append(item)
        self._opened(at, item_id, True)
        self._out.append(_MESSAGE_ADDED % (self._seq, at, self._open_id))
        self._seq += 1
        self._emit_raw(b"response.content_part.added", _PART_ADDED % self._open_ids)

    def _tool(self, tc: Mapping[str, Any]) -> None:
        idx = tc.get("index", 0)
        fn = tc.get("function")
        if not isinstance(fn, dict):
            fn = {}
        if idx not in self._tools:
            self._close()
            at = len(self._items)
            self._tools[idx] = at
            n = len(self._tools) - 1
            call_id = str(tc.get("id") or f"call_{self._base}_{n}")
            item = function_item(
                f"fc_{self._base}_{n}", call_id, str(fn.get("name") or ""), "", "in_progress"
            )
            self._items.append(item)
            self._emit("response.output_item.added", output_index=at, item=dict(item))
            self._opened(at, item["id"], False)
        at = self._tools[idx]
        item = self._items[at]
        if fn.get("name") and not item["name"]:
            item["name"] = str(fn["name"])
        args = fn.get("arguments")
        if isinstance(args, str) and args:
            if at != self._open:  # a call that is no longer the open item
                item["arguments"] += args
                return
            self._parts.append(args)
            self._emit_raw(
                b"response.function_call_arguments.delta",
                b'%b,"delta":%b' % (self._open_ids, jsonfast.dumps(args)),
            )

    def _close(self) -> None:
        if self._open is None:
            return
        at, self._open, self._delta_head = self._open, None, b""
        item = self._items[at]
        item["status"] = "completed"
        text = "".join(self._parts)
        if item["type"] == "message":
            item["content"][0]["text"] = text
            # the text encoded once for both events (the bytes _event writes: the part's
            # keys in message_item's order)
            ids, encoded = self._open_ids, jsonfast.dumps(text)
            self._emit_raw(
                b"response.output_text.done",
                b'%b,"content_index":0,"text":%b,"logprobs":[]' % (ids, encoded),
            )
            self._emit_raw(
                b"response.content_part.done",
                b'%b,"content_index":0,"part":{"type":"output_text","annotations":[],'
                b'"logprobs":[],"text":%b}' % (ids, encoded),
            )
            self._encoded[at] = done = _MESSAGE_DONE % (self._open_id, encoded)
            self._emit_raw(
                b"response.output_item.done", b'"output_index":%d,"item":%b' % (at, done)
            )
            return
        item["arguments"] = text
        self._emit(
            "response.function_call_arguments.done",
            item_id=item["id"],
            output_index=at,
            name=item["name"],
            arguments=item["arguments"],
        )
        self._emit("response.output_item.done", output_index=at, item=item)

    def _end(self) -> None:
        self._close()
        self.done = True
        for item in self._items:
            item["status"] = "completed"
        self.status = "failed" if self.error else final_status(self.finish)

    def final(self) -> bytes:
        """The last event: completed / incomplete, or failed (also when the stream ended
        without ``[DONE]``)."""
        if not self.done:
            self.error = self.error or {
                "code": "server_error",
                "message": "the engine's stream ended early",
            }
            self._end()
        pending, self._out = b"".join(self._out), []
        return pending + self._final_event()

    def _final_event(self) -> bytes:
        """:func:`final_event` of ``response``, from the bytes encoded so far."""
        encoded = self._encoded
        items = [encoded.get(i) or jsonfast.dumps(it) for i, it in enumerate(self._items)]
        response = self._bytes.encode(
            self.status,
            b"[" + b",".join(items) + b"]",
            b"null" if self.usage is None else jsonfast.dumps(self.usage),
            jsonfast.dumps(self.error) if self.error else b"null",
        )
        return _raw_event(_final_kind(self.status), self._seq, b'"response":' + response)

    @property
    def final_seq(self) -> int:
        """The sequence number of the last event."""
        return self._seq
