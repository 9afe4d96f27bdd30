"""A ``tideserve.v1.RequestRecord`` for every gateway request, on ``{prefix}:requests``.

Shape: an aiohttp middleware (:func:`record_requests`) opens a :class:`RequestTrace` per
OpenAI/SGLang request and keeps it on the request (``request[TRACE_KEY]``); the gateway's
handlers call the ``note_*`` hooks at the few points only they see (parsed, admitted,
picked, first byte, streamed bytes, errors). When the handler returns, the middleware
builds the record (pure: :func:`build_record`) and offers it to a ``RecordSink``
(:mod:`.record_sink`), a bounded in-memory buffer a background task flushes to Redis in
pipelined batches. The
request path never waits on Redis: a full buffer or a Redis outage drops records and
counts them (``sink.stats``).

W3C trace context: the trace id comes from the incoming ``traceparent`` header when it is
valid, else a new one; the engine gets ``traceparent`` with that trace id and the
gateway's own span id (:func:`outgoing_traceparent`). Every hook is a no-op for a request
without a trace (records off).

Times: ``queue_ms`` is admission (parsed → admitted), ``ttft_ms`` arrival → first byte to
the client (for a non-streamed answer, the whole answer), ``tpot_ms`` the mean time per
output token after the first (streamed answers only), ``e2e_ms`` arrival → handler done.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import re
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from tideserve.v1 import events_pb2

from services.scheduler.feeds.record_sink import RecordSink
from services.scheduler.http.openai import ParsedRequest
from services.scheduler.routing.types import Decision, Pick

__all__ = [
    "TRACE_KEY",
    "RequestTrace",
    "Usage",
    "build_record",
    "fill_decision",
    "format_traceparent",
    "note_admitted",
    "note_body",
    "note_cancelled",
    "note_chunk",
    "note_error",
    "note_first_byte",
    "note_pick",
    "note_request",
    "outcome_for",
    "outgoing_traceparent",
    "parse_traceparent",
    "record_requests",
    "usage_from_body",
    "usage_from_sse",
]

log = logging.getLogger(__name__)

RECORDED_PATHS = frozenset({"/v1/chat/completions", "/v1/completions", "/generate"})
_TAIL_BYTES = 8192
_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$")


# --------------------------------------------------------------------------- pure parts


def parse_traceparent(value: str | None) -> tuple[str, str, str] | None:
    """(trace id, parent span id, flags) of a valid W3C ``traceparent``; None otherwise
    (absent, malformed, version ff, or an all-zero id)."""
    if not value:
        return None
    m = _TRACEPARENT.match(value.strip().lower())
    if m is None:
        return None
    version, trace_id, parent, flags, rest = m.groups()
    if version == "ff" or (version == "00" and rest):
        return None
    if trace_id == "0" * 32 or parent == "0" * 16:
        return None
    return trace_id, parent, flags


def format_traceparent(trace_id: str, span_id: str, flags: str = "01") -> str:
    return f"00-{trace_id}-{span_id}-{flags}"


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0


def _usage_of(obj: Any) -> Usage | None:
    if not isinstance(obj, dict):
        return None
    u = obj.get("usage")
    if isinstance(u, dict):
        details = u.get("prompt_tokens_details")
        cached = details.get("cached_tokens", 0) if isinstance(details, dict) else 0
        return Usage(
            int(u.get("prompt_tokens") or 0),
            int(u.get("completion_tokens") or 0),
            int(cached or 0),
        )
    meta = obj.get("meta_info")  # SGLang /generate
    if isinstance(meta, dict) and "prompt_tokens" in meta:
        return Usage(
            int(meta.get("prompt_tokens") or 0),
            int(meta.get("completion_tokens") or 0),
            int(meta.get("cached_tokens") or 0),
        )
    return None


def usage_from_body(body: bytes) -> Usage | None:
    """Token usage of a whole JSON answer (OpenAI ``usage`` or SGLang ``meta_info``)."""
    try:
        return _usage_of(json.loads(body))
    except (ValueError, TypeError):
        return None


def usage_from_sse(tail: bytes) -> Usage | None:
    """The last token usage in the tail of an SSE stream (None if none is complete)."""
    for event in reversed(tail.split(b"\n\n")):
        line = event.strip()
        if not line.startswith(b"data:") or (b"usage" not in line and b"meta_info" not in line):
            continue
        u = usage_from_body(line[5:].strip())
        if u is not None:
            return u
    return None


def outcome_for(status: int, error: str, cancelled: bool) -> events_pb2.RequestOutcome:
    if cancelled:
        return events_pb2.REQUEST_OUTCOME_CANCELLED
    if status == 200:
        return events_pb2.REQUEST_OUTCOME_UPSTREAM_ERROR if error else events_pb2.REQUEST_OUTCOME_OK
    if status == 429:
        return events_pb2.REQUEST_OUTCOME_SHED
    if status in (408, 504):
        return events_pb2.REQUEST_OUTCOME_TIMEOUT
    if 400 <= status < 500:
        return events_pb2.REQUEST_OUTCOME_CLIENT_ERROR
    return events_pb2.REQUEST_OUTCOME_UPSTREAM_ERROR


@dataclass(slots=True)
class RequestTrace:
    """What the gateway learned about one request (times from ``clock``, monotonic s)."""

    request_id: str
    trace_id: str
    span_id: str
    flags: str
    arrival: float
    arrival_wall: float
    clock: Callable[[], float] = time.monotonic
    parsed: ParsedRequest | None = None
    parsed_at: float | None = None
    admitted_at: float | None = None
    pick: Pick | None = None
    retries: int = 0
    first_byte: float | None = None
    streamed: bool = False
    tail: bytearray = field(default_factory=bytearray)
    body: bytes = b""
    error: str = ""
    cancelled: bool = False

    @property
    def traceparent(self) -> str:
        return format_traceparent(self.trace_id, self.span_id, self.flags)


TRACE_KEY = web.RequestKey("tideserve.trace", RequestTrace)


def _ms(a: float | None, b: float | None) -> float:
    return max(0.0, (b - a) * 1000.0) if a is not None and b is not None else 0.0


def build_record(
    t: RequestTrace,
    *,
    status: int,
    finish: float,
    finish_wall: float,
    deployment: str,
    error: str = "",
    replica_id: str = "",
) -> events_pb2.RequestRecord:
    """The record of a finished request (pure)."""
    p = t.parsed
    usage = usage_from_sse(bytes(t.tail)) if t.streamed else usage_from_body(t.body)
    completion = usage.completion_tokens if usage else 0
    tpot = 0.0
    if t.streamed and completion > 1 and t.first_byte is not None:
        tpot = _ms(t.first_byte, finish) / (completion - 1)
    rec = events_pb2.RequestRecord(
        request_id=t.request_id,
        trace_id=t.trace_id,
        deployment=deployment,
        prompt_tokens=usage.prompt_tokens if usage and usage.prompt_tokens else 0,
        completion_tokens=completion,
        cached_tokens=usage.cached_tokens if usage else 0,
        queue_ms=_ms(t.parsed_at, t.admitted_at),
        ttft_ms=_ms(t.arrival, t.first_byte),
        tpot_ms=tpot,
        e2e_ms=_ms(t.arrival, finish),
        outcome=outcome_for(status, t.error, t.cancelled),
        http_status=status,
        error=(t.error or error)[:500],
        retries=t.retries,
        arrival_ms=int(t.arrival_wall * 1000),
        finish_ms=int(finish_wall * 1000),
        replica_id=replica_id,
        source="http",
    )
    if p is not None:
        rec.model = p.model
        rec.tenant = p.tenant
        rec.slo_class = p.slo_class
        rec.session_id = p.session_id
        rec.profile = p.profile
        if not rec.prompt_tokens:
            rec.prompt_tokens = len(p.prompt_ids)
    if t.pick is not None:
        fill_decision(rec, t.pick)
    return rec


def fill_decision(rec: events_pb2.RequestRecord, d: Pick) -> None:
    """Copy what routing decided and why (endpoints, plugin scores, predictions) into
    ``rec``; prefill-side scores are named ``prefill/<plugin>``."""
    rec.profile = d.profile
    rec.decode_instance = d.decode.endpoint.instance_id
    rec.disaggregated = d.prefill is not None
    rec.predicted_cached_tokens = d.predicted_cached_tokens
    rec.predicted_ttft_ms = d.predicted_ttft_ms
    scores = [events_pb2.PluginScore(plugin=n, score=s, weight=w) for n, s, w in d.decode.scores]
    if d.prefill is not None:
        rec.prefill_instance = d.prefill.endpoint.instance_id
        scores += [
            events_pb2.PluginScore(plugin=f"prefill/{n}", score=s, weight=w)
            for n, s, w in d.prefill.scores
        ]
    rec.scores.extend(scores)


# --------------------------------------------------------------------------- hooks


def _trace(req: web.Request) -> RequestTrace | None:
    t = req.get(TRACE_KEY)
    return t if isinstance(t, RequestTrace) else None


def note_request(req: web.Request, request_id: str, parsed: ParsedRequest) -> None:
    t = _trace(req)
    if t is not None:
        t.request_id, t.parsed, t.parsed_at = request_id, parsed, t.clock()


def note_admitted(req: web.Request) -> None:
    t = _trace(req)
    if t is not None:
        t.admitted_at = t.clock()


def note_pick(req: web.Request, decision: Decision, attempt: int) -> None:
    t = _trace(req)
    if t is not None and isinstance(decision, Pick):
        t.pick, t.retries = decision, attempt


def note_first_byte(req: web.Request, streamed: bool) -> None:
    t = _trace(req)
    if t is not None and t.first_byte is None:
        t.first_byte, t.streamed = t.clock(), streamed


def note_chunk(req: web.Request, chunk: bytes) -> None:
    t = _trace(req)
    if t is not None:
        t.tail += chunk
        if len(t.tail) > _TAIL_BYTES:
            del t.tail[: len(t.tail) - _TAIL_BYTES]


def note_body(req: web.Request, body: bytes) -> None:
    note_first_byte(req, False)
    t = _trace(req)
    if t is not None:
        t.body = body


def note_error(req: web.Request, error: str) -> None:
    t = _trace(req)
    if t is not None:
        t.error = error


def note_cancelled(req: web.Request) -> None:
    t = _trace(req)
    if t is not None:
        t.cancelled = True


def outgoing_traceparent(req: web.Request) -> str | None:
    """``traceparent`` for the engine: the trace's (gateway span as parent) when records
    are on, else the client's header unchanged, else None."""
    t = _trace(req)
    if t is not None:
        return t.traceparent
    return req.headers.get("traceparent")


# --------------------------------------------------------------------------- shell


def _error_message(resp: web.StreamResponse) -> str:
    if isinstance(resp, web.Response) and resp.status != 200 and isinstance(resp.body, bytes):
        try:
            err = json.loads(resp.body).get("error", {})
            return str(err.get("message", ""))[:500] if isinstance(err, dict) else ""
        except (ValueError, AttributeError):
            return ""
    return ""


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def record_requests(
    sink: RecordSink,
    *,
    deployment: str = "",
    replica_id: str = "",
    clock: Callable[[], float] = time.monotonic,
    wall: Callable[[], float] = time.time,
    rng: random.Random | None = None,
    paths: Iterable[str] = RECORDED_PATHS,
) -> Any:
    """The aiohttp middleware recording every request to ``paths`` into ``sink``."""
    rand = rng or random.Random()
    wanted = frozenset(paths)

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path not in wanted:
            return await handler(request)
        incoming = parse_traceparent(request.headers.get("traceparent"))
        trace_id, flags = (incoming[0], incoming[2]) if incoming else (None, "01")
        t = RequestTrace(
            request_id=uuid.uuid4().hex,
            trace_id=trace_id or f"{rand.getrandbits(128):032x}",
            span_id=f"{rand.getrandbits(64) or 1:016x}",
            flags=flags,
            arrival=clock(),
            arrival_wall=wall(),
            clock=clock,
        )
        request[TRACE_KEY] = t
        status, error = 500, ""
        try:
            resp = await handler(request)
            status, error = resp.status, _error_message(resp)
            return resp
        except web.HTTPException as e:
            status, error = e.status, e.reason
            raise
        except asyncio.CancelledError:
            t.cancelled = True
            raise
        except Exception as e:
            error = f"gateway error: {e!r}"
            raise
        finally:
            try:
                sink.offer(
                    build_record(
                        t,
                        status=status,
                        finish=clock(),
                        finish_wall=wall(),
                        deployment=deployment,
                        error=error,
                        replica_id=replica_id,
                    )
                )
            except Exception:  # a record must never break the request
                log.exception("request record failed")

    return middleware
