"""The per-request context of the HTTP gateway, and a ``tideserve.v1.RequestRecord`` for
every gateway request on ``{prefix}:requests``.

:func:`request_contexts` is the gateway's middleware inside the OpenTelemetry server span
(:func:`services.common.otel.server_middleware`, which continues an incoming
``traceparent``): it opens the request's
:class:`~services.scheduler.core.records.RequestContext` (the span's trace id; the engines
get the trace from the traced upstream client, whose span is their parent), keeps it on
the request (:data:`CONTEXT_KEY`) and binds the request id for log lines
(:func:`services.common.logs.request_scope`). The handler takes it from there and carries it
through intake, routing, forwarding and relaying. When the handler is done, the middleware
hands the context and how the request ended (:class:`Ending`, with the request's span) to
the gateway's ``finished`` listeners: its metrics, :func:`annotate_span` (GenAI and
routing attributes on the span, :mod:`services.scheduler.core.genai`) and with records on
:func:`record_requests`, which builds the record once (pure:
:func:`~services.scheduler.core.records.build_record`) and offers it to a ``RecordSink``
(:mod:`services.scheduler.feeds.record_sink`), a bounded in-memory buffer a background task
flushes to Redis in pipelined batches. The request path never waits on Redis: a full buffer
or a Redis outage drops records and counts them (``sink.stats``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger
from opentelemetry import trace

from services.common.logs import request_scope
from services.common.otel import trace_ids
from services.scheduler.core.genai import span_attributes
from services.scheduler.core.records import RequestContext, build_record
from services.scheduler.feeds.record_sink import RecordSink

__all__ = [
    "CONTEXT_KEY",
    "RECORDED_PATHS",
    "AccessLogger",
    "Ending",
    "Finished",
    "annotate_span",
    "record_requests",
    "request_contexts",
]

log = logging.getLogger(__name__)

RECORDED_PATHS = frozenset(
    {"/v1/chat/completions", "/v1/completions", "/generate", "/v1/messages", "/v1/responses"}
)
CONTEXT_KEY = web.RequestKey("tideserve.context", RequestContext)


@dataclass(frozen=True, slots=True)
class Ending:
    """How a request ended: its HTTP status (500 when the handler raised or was
    cancelled), an error message, when (monotonic and wall seconds), whether the
    handler was cancelled (the client went away), and the request's span."""

    status: int
    error: str
    finish: float
    finish_wall: float
    aborted: bool = False
    span: trace.Span = trace.INVALID_SPAN


Finished = Callable[[RequestContext, Ending], None]
"""A listener of finished requests; must not block (it runs on the request path)."""


def _error_message(resp: web.StreamResponse) -> str:
    if isinstance(resp, web.Response) and resp.status != 200 and isinstance(resp.body, bytes):
        try:
            err = json.loads(resp.body).get("error", {})
            return str(err.get("message", ""))[:500] if isinstance(err, dict) else ""
        except (ValueError, AttributeError):
            return ""
    return ""


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def request_contexts(
    listeners: Sequence[Finished],
    *,
    clock: Callable[[], float] = time.monotonic,
    wall: Callable[[], float] = time.time,
    rng: random.Random | None = None,
    paths: Iterable[str] = RECORDED_PATHS,
    tool_contents: bool = False,
) -> Any:
    """The middleware opening a context per request to ``paths`` and telling
    ``listeners`` (read when each request ends) how it ended. Outside a span (no tracing
    middleware in front) the trace id is a random one from ``rng``. ``tool_contents``:
    keep the answer's tool-call arguments."""
    rand = rng or random.Random()
    # Request ids: 128 random bits from a generator seeded from os.urandom (unique across
    # replicas, unlike ``rng``, which may be seeded; cheaper than uuid4's urandom call).
    ids = random.Random()
    wanted = frozenset(paths)

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path not in wanted:
            return await handler(request)
        span = trace.get_current_span()
        trace_id = trace_ids(span)[0]
        ctx = RequestContext(
            request_id=f"{ids.getrandbits(128):032x}",
            trace_id=trace_id or f"{rand.getrandbits(128) or 1:032x}",
            arrival=clock(),
            arrival_wall=wall(),
            path=request.path,
            tool_contents=tool_contents,
        )
        request[CONTEXT_KEY] = ctx
        with request_scope(ctx.request_id):
            status, error, aborted = 500, "", False
            try:
                resp = await handler(request)
                status, error = resp.status, _error_message(resp)
                return resp
            except web.HTTPException as e:
                status, error = e.status, e.reason
                raise
            except asyncio.CancelledError:
                ctx.cancelled = aborted = True
                raise
            except Exception as e:
                error = f"gateway error: {e!r}"
                raise
            finally:
                end = Ending(status, error, clock(), wall(), aborted, span)
                for listener in listeners:
                    try:
                        listener(ctx, end)
                    except Exception:  # a listener must never break the request
                        log.exception("finished-request listener failed")

    return middleware


def annotate_span(ctx: RequestContext, end: Ending) -> None:
    """The listener putting the GenAI and routing attributes on the request's span (only
    when it is recorded: unsampled requests cost nothing here)."""
    if end.span.is_recording():
        end.span.set_attributes(span_attributes(ctx, status=end.status, finish=end.finish))


def record_requests(sink: RecordSink, *, deployment: str = "", replica_id: str = "") -> Finished:
    """The listener building each finished request's record into ``sink``."""

    def record(ctx: RequestContext, end: Ending) -> None:
        sink.offer(
            build_record(
                ctx,
                status=end.status,
                finish=end.finish,
                finish_wall=end.finish_wall,
                deployment=deployment,
                error=end.error,
                replica_id=replica_id,
            )
        )

    return record


class AccessLogger(AbstractAccessLogger):
    """aiohttp's access log line (``METHOD path status``), written after the request's own
    context is gone, with the request's ``trace_id`` and ``request_id`` (recorded paths)
    and its status, size and time as fields."""

    @property
    def enabled(self) -> bool:
        return self.logger.isEnabledFor(logging.INFO)

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        extra: dict[str, object] = {
            "status": response.status,
            "bytes": response.body_length,
            "ms": round(time * 1000.0, 3),
        }
        ctx = request.get(CONTEXT_KEY)
        if isinstance(ctx, RequestContext):
            extra["trace_id"], extra["request_id"] = ctx.trace_id, ctx.request_id
        self.logger.info("%s %s %s", request.method, request.path, response.status, extra=extra)
