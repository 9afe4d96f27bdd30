"""Request records (pure): the per-request context and the ``tideserve.v1.RequestRecord``
built from it, shared by both shells.

The HTTP gateway carries one :class:`RequestContext` per request (intake → route → forward
→ relay) and builds its record once, at the end (:func:`build_record`); gRPC-served
decisions build theirs from the pick and the reported outcome
(:mod:`services.scheduler.core.pick_records`). Both copy the decision with one
:func:`fill_decision`. Also the W3C ``traceparent`` parser (for the gRPC ``Pick``'s; the
HTTP gateway's trace context is OpenTelemetry's), token usage and tool calls from engine
answers (:meth:`RequestContext.answer`, parsed once), and the outcome of a finished request.

Times: ``queue_ms`` is admission (parsed → admitted), ``ttft_ms`` arrival → first byte to
the client (for a non-streamed answer, the whole answer), ``tpot_ms`` the mean time per
output token after the first (streamed answers only), ``e2e_ms`` arrival → handler done.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Protocol

from tideserve.v1 import events_pb2

from services.common import jsonfast
from services.common.routing.types import Decision, Pick
from services.scheduler.core.tools import (
    StreamToolCalls,
    ToolCallFact,
    ToolResultFact,
    tool_calls_of,
)

__all__ = [
    "Answer",
    "RequestContext",
    "RequestFacts",
    "StreamFacts",
    "Usage",
    "build_record",
    "facts_answer",
    "fill_decision",
    "outcome_for",
    "parse_traceparent",
    "tpot_ms",
    "usage_from_body",
    "usage_from_sse",
]

_TAIL_BYTES = 8192
_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$")


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


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    # P/D with real KV bytes: the decode engine's measured transfer (usage.kv_transfer_ms,
    # kv_transfer_bytes) or its failed pull (usage.kv_transfer_failed: it recomputed).
    kv_transfer_ms: float = 0.0
    kv_transfer_bytes: int = 0
    kv_transfer_failed: bool = False


def _usage_of(obj: Any) -> Usage | None:
    if not isinstance(obj, dict):
        return None
    u = obj.get("usage")
    if (isinstance(u, dict) and "input_tokens" in u) or obj.get("type") == "message_start":
        return _anthropic_usage(obj)
    if isinstance(u, dict):
        details = u.get("prompt_tokens_details")
        cached = details.get("cached_tokens", 0) if isinstance(details, dict) else 0
        return Usage(
            int(u.get("prompt_tokens") or 0),
            int(u.get("completion_tokens") or 0),
            int(cached or 0),
            *_kv_fields(u),
        )
    meta = obj.get("meta_info")  # SGLang /generate
    if isinstance(meta, dict) and "prompt_tokens" in meta:
        return Usage(
            int(meta.get("prompt_tokens") or 0),
            int(meta.get("completion_tokens") or 0),
            int(meta.get("cached_tokens") or 0),
            *_kv_fields(meta),
        )
    return None


def _anthropic_usage(obj: dict[str, Any]) -> Usage | None:
    """An Anthropic message's usage (or its stream's ``message_start`` / ``message_delta``):
    the prompt is ``input_tokens`` plus the tokens read from and written to the cache."""
    msg = obj.get("message")
    u = obj.get("usage") if obj.get("usage") is not None else None
    if u is None and isinstance(msg, dict):
        u = msg.get("usage")
    if not isinstance(u, dict):
        return None
    cached = int(u.get("cache_read_input_tokens") or 0)
    written = int(u.get("cache_creation_input_tokens") or 0)
    prompt = int(u.get("input_tokens") or 0) + cached + written
    return Usage(prompt, int(u.get("output_tokens") or 0), cached)


def _kv_fields(obj: dict[str, Any]) -> tuple[float, int, bool]:
    """``kv_transfer_ms``, ``kv_transfer_bytes``, ``kv_transfer_failed`` (absent, wrong
    type or negative: 0 / False)."""
    return (
        _positive(obj.get("kv_transfer_ms")),
        int(_positive(obj.get("kv_transfer_bytes"))),
        obj.get("kv_transfer_failed") is True,
    )


def _positive(value: Any) -> float:
    """``value`` as a positive number, else 0.0 (booleans are not numbers here)."""
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        return float(value)
    return 0.0


def _json(body: bytes) -> Any:
    try:
        return jsonfast.loads(body)
    except (ValueError, TypeError):
        return None


def usage_from_body(body: bytes) -> Usage | None:
    """Token usage of a whole JSON answer (OpenAI ``usage`` or SGLang ``meta_info``)."""
    return _usage_of(_json(body))


def usage_from_sse(tail: bytes) -> Usage | None:
    """The last token usage in the tail of an SSE stream (None if none is complete):
    OpenAI chunks, SGLang's ``meta_info``, or an Anthropic ``message_delta``. Lines may end
    in CRLF or CR, as SSE allows (a JSON document holds neither unescaped)."""
    if b"\r" in tail:  # a quick look (memchr) spares the copies of the usual stream
        tail = tail.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    for event in reversed(tail.split(b"\n\n")):
        line = event.strip()
        if line.startswith(b"event:"):  # a named event (Anthropic's): its data line
            line = line.partition(b"\n")[2].strip()
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


class RequestFacts(Protocol):
    """What the record needs of a parsed request (the HTTP shell's ``ParsedRequest``)."""

    @property
    def model(self) -> str: ...
    @property
    def tenant(self) -> str: ...
    @property
    def slo_class(self) -> str: ...
    @property
    def session_id(self) -> str: ...
    @property
    def parent_session_id(self) -> str: ...
    @property
    def session_final(self) -> bool: ...
    @property
    def profile(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def prompt_ids(self) -> tuple[int, ...]: ...
    @property
    def tools_offered(self) -> int: ...
    @property
    def tool_results(self) -> tuple[ToolResultFact, ...]: ...


@dataclass(frozen=True, slots=True)
class Answer:
    """What the engine's answer said: token usage (None when it gave none) and tool calls."""

    usage: Usage | None
    tool_calls: tuple[ToolCallFact, ...] = ()


class StreamFacts(Protocol):
    """What a translator that parses every chunk of a streamed chat answer keeps for the
    record: the last chunk with a ``usage`` object, and the chunks whose line names a tool
    call (those :class:`~services.scheduler.core.tools.StreamToolCalls` reads)."""

    @property
    def usage_chunk(self) -> dict[str, Any] | None: ...
    @property
    def tool_chunks(self) -> list[Any]: ...


def facts_answer(facts: StreamFacts, keep: bool) -> Answer:
    """The answer of a stream a translator parsed: what the tail and the tool-call reader
    give for the same chunks."""
    calls: tuple[ToolCallFact, ...] = ()
    if facts.tool_chunks:
        tools = StreamToolCalls(keep=keep)
        for chunk in facts.tool_chunks:
            tools.event(chunk)
        calls = tools.calls()
    given = facts.usage_chunk
    return Answer(_usage_of(given) if given is not None else None, calls)


@dataclass(slots=True)
class RequestContext:
    """One request from arrival to its last byte (times: monotonic seconds, passed in).
    The shell opens it on arrival and carries it through intake, routing, forwarding and
    relaying; :func:`build_record` turns it into the record once, at the end."""

    request_id: str
    trace_id: str
    arrival: float
    arrival_wall: float
    path: str = ""
    tool_contents: bool = False
    """Keep tool-call arguments (not only names and sizes) of the answer."""
    parsed: RequestFacts | None = None
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
    stream_tools: bool = True
    """Read tool calls off the streamed chunks; off when the answer's are given by
    :meth:`answered` (a native Responses stream, which names none the chat way)."""
    facts: StreamFacts | None = None
    """A translator that parses every chunk of the streamed answer: the record reads its
    usage and tool calls from the chunks it kept, and :meth:`chunk` keeps nothing."""
    _tools: StreamToolCalls | None = field(default=None, init=False, repr=False)
    _answer: Answer | None = field(default=None, init=False, repr=False)

    def taken_in(self, request_id: str, parsed: RequestFacts, now: float) -> None:
        self.request_id, self.parsed, self.parsed_at = request_id, parsed, now

    def admitted(self, now: float) -> None:
        self.admitted_at = now

    def picked(self, decision: Decision, attempt: int) -> None:
        if isinstance(decision, Pick):
            self.pick, self.retries = decision, attempt

    def answering(self, now: float, streamed: bool) -> None:
        """The first byte of the answer goes to the client (once)."""
        if self.first_byte is None:
            self.first_byte, self.streamed = now, streamed

    def chunk(self, data: bytes) -> None:
        """A streamed chunk (the tail is kept for the usage of the last event; tool-call
        fragments are accumulated)."""
        if self.facts is not None:
            return
        self.tail += data
        if len(self.tail) > _TAIL_BYTES:
            del self.tail[: len(self.tail) - _TAIL_BYTES]
        if not self.stream_tools:
            return
        if self._tools is None:
            self._tools = StreamToolCalls(keep=self.tool_contents)
        self._tools.feed(data)

    def whole(self, now: float, body: bytes) -> None:
        """A whole (non-streamed) answer."""
        self.answering(now, False)
        self.body = body

    def answer(self) -> Answer:
        """Usage and tool calls of the answer, parsed once (call when the answer is
        complete: the first call's result is kept)."""
        if self._answer is None:
            if self.streamed and self.facts is not None:
                self._answer = facts_answer(self.facts, self.tool_contents)
            elif self.streamed:
                calls = self._tools.calls() if self._tools is not None else ()
                self._answer = Answer(usage_from_sse(bytes(self.tail)), calls)
            else:
                obj = _json(self.body)
                self._answer = Answer(_usage_of(obj), tool_calls_of(obj, self.tool_contents))
        return self._answer

    def answered(self, obj: dict[str, Any]) -> None:
        """The answer as a whole chat completion (decoded), for an answer in another API (a
        native Responses answer): usage and tool calls are read from this instead."""
        self._answer = Answer(_usage_of(obj), tool_calls_of(obj, self.tool_contents))


def _ms(a: float | None, b: float | None) -> float:
    return max(0.0, (b - a) * 1000.0) if a is not None and b is not None else 0.0


def tpot_ms(t: RequestContext, finish: float, completion_tokens: int) -> float:
    """Mean time per output token after the first, of a streamed answer (0 otherwise)."""
    if t.streamed and completion_tokens > 1 and t.first_byte is not None:
        return _ms(t.first_byte, finish) / (completion_tokens - 1)
    return 0.0


def build_record(
    t: RequestContext,
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
    answer = t.answer()
    usage = answer.usage
    completion = usage.completion_tokens if usage else 0
    rec = events_pb2.RequestRecord(
        request_id=t.request_id,
        trace_id=t.trace_id,
        deployment=deployment,
        prompt_tokens=usage.prompt_tokens if usage and usage.prompt_tokens else 0,
        completion_tokens=completion,
        cached_tokens=usage.cached_tokens if usage else 0,
        kv_transfer_ms=usage.kv_transfer_ms if usage else 0.0,
        kv_transfer_bytes=usage.kv_transfer_bytes if usage else 0,
        kv_transfer_failed=usage.kv_transfer_failed if usage else False,
        queue_ms=_ms(t.parsed_at, t.admitted_at),
        ttft_ms=_ms(t.arrival, t.first_byte),
        tpot_ms=tpot_ms(t, finish, completion),
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
        rec.parent_session_id = p.parent_session_id
        rec.profile = p.profile
        rec.api = p.kind
        if not rec.prompt_tokens:
            rec.prompt_tokens = len(p.prompt_ids)
        rec.tools_offered = p.tools_offered
        rec.tool_results.extend(
            events_pb2.ToolResult(
                tool_call_id=r.tool_call_id,
                name=r.name,
                content_bytes=r.content_bytes,
                content=r.content,
            )
            for r in p.tool_results
        )
    rec.tool_calls.extend(
        events_pb2.ToolCall(
            id=c.id, name=c.name, argument_bytes=c.argument_bytes, arguments=c.arguments
        )
        for c in answer.tool_calls
    )
    if t.pick is not None:
        fill_decision(rec, t.pick)
    return rec


def fill_decision(rec: events_pb2.RequestRecord, d: Pick) -> None:
    """Copy what routing decided and why (endpoints, plugin scores, predictions) into
    ``rec``; prefill-side scores are named ``prefill/<plugin>``. The engine load at pick
    (for the performance-model fit): the prefill queued ahead on the engine that computes
    the prompt (the prefill instance when disaggregated; engine-reported + this gateway's
    unreported picks), the running batch and tokens in flight of the decoding one."""
    rec.profile = d.profile
    computes = (d.prefill or d.decode).endpoint
    rec.engine_pending_prefill_tokens = computes.pending_prefill
    rec.engine_running = d.decode.endpoint.running
    rec.engine_tokens_in_flight = d.decode.endpoint.tokens_in_flight
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
