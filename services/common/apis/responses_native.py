"""An engine's own Responses stream passed through (pure, incremental: fed raw bytes at any
chunk boundary), with the ``response`` objects' ``id``, ``previous_response_id``, ``store``
and ``metadata`` set to the gateway's (:class:`NativeResponses`). Its last event is held back
as :class:`~services.common.apis.responses_stream.ChatToResponses` holds back its own. Only
the events that carry a response object are decoded and re-encoded: the others (deltas,
items and parts) go through as the engine sent them.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from services.common import jsonfast
from services.common.apis.responses import ResponsesRequest
from services.common.apis.responses_answer import response_object
from services.common.apis.responses_stream import final_event, sse_events

__all__ = ["NativeResponses", "patch_response", "plain_event", "usual_shape"]

_FINAL = ("response.completed", "response.incomplete", "response.failed")

_SEQ = re.compile(rb'"sequence_number"\s*:\s*(\d+)')


def plain_event(raw: bytes) -> bytes | None:
    """The data of an engine's event that passes through unchanged: one ``event:`` line,
    one ``data:`` line holding a JSON object, and no response object in it (deltas, items
    and parts opened and closed); None for every other event."""
    head, sep, data = raw.partition(b"\ndata:")
    if not sep or not head.startswith(b"event:") or b"\n" in head or b"\n" in data:
        return None
    data = data.strip()
    if not data.startswith(b"{") or b'"response"' in data:
        return None
    return data


def _split_event(raw: bytes) -> Iterator[tuple[str, str | bytes]]:
    """:func:`sse_events` of one event (without its blank line), quicker for the usual
    ``event:`` line and ``data:`` line."""
    head, sep, data = raw.partition(b"\ndata:")
    if sep and head.startswith(b"event:") and b"\n" not in head and b"\n" not in data:
        # the data stays bytes: the JSON decoder reads UTF-8 (and refuses what is not)
        yield head[6:].strip().decode("utf-8", "replace"), data.strip()
    else:
        yield from sse_events(bytearray(raw + b"\n\n"))


def _loads(payload: str | bytes) -> Any:
    """An event's JSON; bytes that are not UTF-8 are read with replacement characters, as
    :func:`sse_events` decodes them. Raises ValueError."""
    try:
        return jsonfast.loads(payload)
    except ValueError:
        if isinstance(payload, str):
            raise
        return jsonfast.loads(payload.decode("utf-8", "replace"))


_SHAPE = re.compile(rb"(?:event:[^\n]*\ndata: ?\{[^\n]*\n\n)+")


def usual_shape(events: bytes) -> bool:
    """Whether ``events`` (whole events, each ending in a blank line) are all of the form
    ``event: ...\ndata: {...}\n\n`` (one pass): then each one without a response object is
    one that :func:`plain_event` passes through. False means: look at each one."""
    return _SHAPE.fullmatch(events) is not None


def patch_response(
    obj: dict[str, Any], req: ResponsesRequest, resp_id: str, store: bool
) -> dict[str, Any]:
    """An engine's response object as the gateway's (id, chain, store, metadata)."""
    obj.update(
        id=resp_id,
        previous_response_id=req.previous_response_id,
        store=store,
        metadata=dict(req.metadata),
    )
    return obj


class NativeResponses:
    """An engine's Responses stream passed through (see the module doc)."""

    def __init__(self, req: ResponsesRequest, resp_id: str, created_at: int, store: bool) -> None:
        self.req, self.resp_id, self.created_at, self.store = req, resp_id, created_at, store
        self._buf = b""
        self._final = b""
        self._last_seq = -1
        self._unread: list[bytes] = []  # runs of plain events passed on, numbering not read
        self.final_seq = 0
        self.response: dict[str, Any] | None = None
        self.done = False

    def feed(self, data: bytes) -> bytes:
        if b"\r" in data:  # a quick look (memchr) spares the copy of the usual stream
            data = data.replace(b"\r\n", b"\n")
        buf = self._buf + data if self._buf else data
        end = buf.rfind(b"\n\n")
        if end < 0:
            self._buf = buf
            return b""
        whole, self._buf = buf[: end + 2], buf[end + 2 :]
        if b"\n\n\n" in whole or not usual_shape(whole):
            return self._one_by_one(whole)  # split exactly as read, one by one
        # The events that carry a response object are rewritten one at a time; the runs of
        # events between them go through in one piece, their numbering read when needed.
        out: list[bytes] = []
        pos = 0
        while (hit := whole.find(b'"response"', pos)) >= 0:
            before = whole.rfind(b"\n\n", pos, hit)
            begin = before + 2 if before >= 0 else pos
            end = whole.find(b"\n\n", hit) + 2
            if begin > pos:
                out.append(self._passed(whole[pos:begin]))
            out.append(self._rewrite(whole[begin : end - 2]))
            pos = end
        if pos < len(whole):
            out.append(self._passed(whole[pos:]))
        return b"".join(out)

    def _passed(self, run: bytes) -> bytes:
        if len(self._unread) >= 64:  # read now and then: a long stream is not kept
            _ = self.last_seq
        self._unread.append(run)
        return run

    def _one_by_one(self, events: bytes) -> bytes:
        parts = events.split(b"\n\n")
        return b"".join(self._one(raw) for raw in parts[:-1])

    def _one(self, raw: bytes) -> bytes:
        """One event (without its blank line): as sent, or rewritten (b"" when dropped)."""
        fast = plain_event(raw)
        if fast is None:
            return self._rewrite(raw)
        seq = _SEQ.search(fast)
        if seq is not None:
            self._numbered(int(seq.group(1)))
        return raw + b"\n\n"

    def _numbered(self, seq: int) -> None:
        self._last_seq = seq
        self._unread.clear()

    @property
    def last_seq(self) -> int:
        """The sequence number of the last event passed on that numbers itself (-1: none);
        the plain events passed on in one piece are read for it only when it is asked."""
        runs, self._unread = self._unread, []
        for events in reversed(runs):
            stop = len(events) - 2
            while stop > 0:
                before = events.rfind(b"\n\n", 0, stop)
                start = before + 2 if before >= 0 else 0
                seq = _SEQ.search(events, start, stop)
                if seq is not None:
                    self._last_seq = int(seq.group(1))
                    return self._last_seq
                stop = start - 2
        return self._last_seq

    def _rewrite(self, raw: bytes) -> bytes:
        """One event re-encoded: its response object made the gateway's, or the gateway's
        own chat-shaped error as a Responses ``error`` event (b"" when it is not JSON)."""
        for name, payload in _split_event(raw):
            try:
                obj = _loads(payload)
            except ValueError:
                return b""
            if not isinstance(obj, dict):
                return b""
            if isinstance(obj.get("response"), dict):
                patch_response(obj["response"], self.req, self.resp_id, self.store)
            if not obj.get("type") and not name and isinstance(obj.get("error"), dict):
                err = obj["error"]
                obj = {
                    "type": "error",
                    "sequence_number": self.last_seq + 1,
                    **{k: err.get(k) for k in ("code", "message", "param")},
                }
            kind = str(obj.get("type") or name)
            seq = obj.get("sequence_number")
            if isinstance(seq, int) and not isinstance(seq, bool):
                self._numbered(seq)
            evt = b"event: " + kind.encode() + b"\ndata: " + jsonfast.dumps(obj) + b"\n\n"
            if kind in _FINAL and isinstance(obj.get("response"), dict):
                self.response, self._final, self.done = obj["response"], evt, True
                self.final_seq = self.last_seq
                return b""
            return evt
        return b""

    def final(self) -> bytes:
        if self.done:
            return self._final
        error = {"code": "server_error", "message": "the engine's stream ended early"}
        self.response = response_object(
            self.req, self.resp_id, self.created_at, status="failed", error=error, store=self.store
        )
        self.done = True
        self.final_seq = self.last_seq + 1
        return final_event(self.response, self.final_seq)
