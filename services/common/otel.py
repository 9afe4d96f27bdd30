"""OpenTelemetry: a tracer provider per service, gRPC interceptors and aiohttp tracing.

The provider is built from settings (:class:`~services.common.settings.TracingSettings`)
and passed down, never installed as a global: ``trace_exporter`` ``none`` (trace context
is created and W3C ``traceparent`` propagates, spans are recorded only under a caller's
sampled ``traceparent``, nothing is exported), ``console`` (spans as JSON on stdout) or
``otlp`` (OTLP/gRPC; endpoint, TLS, headers and timeout from settings: :func:`otlp_options`
is the pure rule, :func:`configure_tracing` the shell that reads the certificate files);
with an exporter, ``trace_sample_ratio`` of new traces are recorded (parent-based).

HTTP: :func:`server_middleware` gives an aiohttp server one SERVER span per request (remote
parent from the incoming ``traceparent``); :func:`client_trace_config` gives an aiohttp
client session one CLIENT span per call and injects ``traceparent`` (and ``baggage``);
:func:`inject` adds the current context to headers for calls made without a traced session.
Both are built on ``opentelemetry-instrumentation-aiohttp-server`` / ``-aiohttp-client``
with the provider passed in. The client one takes a provider as is
(``create_trace_config``); the server instrumentation's middleware reads module globals
that only its global ``instrument()`` sets (it also replaces ``web.Application`` process
wide), so the server middleware here is a thin one around that package's attribute helpers.

Every provider also copies the ``gen_ai.conversation.id`` baggage entry (a session id set
by the gateway, :func:`conversation`) onto each span it starts, so every span of an agent's
turn, in any service the trace reaches, carries the session id.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import grpc
from aiohttp import web
from opentelemetry import baggage, trace
from opentelemetry import context as otel_context
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.instrumentation import aiohttp_client as _otel_aiohttp_client
from opentelemetry.instrumentation import aiohttp_server as _otel_aiohttp_server
from opentelemetry.instrumentation import grpc as _otel_grpc_module
from opentelemetry.instrumentation.utils import is_http_instrumentation_enabled
from opentelemetry.metrics import NoOpMeterProvider
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
)
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, Decision, ParentBased, TraceIdRatioBased
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from services.common.errors import SettingsError
from services.common.settings import TracingSettings

# The instrumentation packages are untyped: reach them through one ``Any`` at the boundary.
_OTEL_GRPC: Any = _otel_grpc_module
_AIOHTTP_SERVER: Any = _otel_aiohttp_server
_AIOHTTP_CLIENT: Any = _otel_aiohttp_client

__all__ = [
    "CONVERSATION_ID",
    "OtlpOptions",
    "add_processors",
    "client_interceptors",
    "client_trace_config",
    "configure_tracing",
    "conversation",
    "inject",
    "otlp_options",
    "quiet_provider",
    "recording",
    "server_interceptor",
    "server_middleware",
    "trace_ids",
]

CONVERSATION_ID = "gen_ai.conversation.id"
"""The GenAI semantic-conventions attribute (and our baggage key) of a session's id."""

# W3C trace context + baggage, explicitly (not the global propagator).
_PROPAGATOR = CompositePropagator([TraceContextTextMapPropagator(), W3CBaggagePropagator()])


# --------------------------------------------------------------------------- OTLP settings


@dataclass(frozen=True, slots=True)
class OtlpOptions:
    """What the OTLP/gRPC exporter is built with (files are read by the shell)."""

    endpoint: str
    insecure: bool
    ca_file: Path | None = None
    client_cert_file: Path | None = None
    client_key_file: Path | None = None
    headers: tuple[tuple[str, str], ...] = ()
    timeout_s: float = 10.0


_METADATA_KEY_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-_.")


def otlp_options(settings: TracingSettings, service: str) -> OtlpOptions:
    """The exporter's options from ``settings`` (pure; rules in
    :class:`~services.common.settings.TracingSettings`). Raises :class:`SettingsError`
    naming the setting for a missing endpoint, a contradiction or a bad header name."""

    def bad(name: str, why: str) -> SettingsError:
        return SettingsError(f"invalid setting {service}.{name}: {why}")

    endpoint = (settings.otlp_endpoint or "").strip()
    if not endpoint:
        raise bad("otlp_endpoint", "required when trace_exporter is otlp")
    scheme = urlsplit(endpoint).scheme.lower() if "://" in endpoint else ""
    if scheme not in ("", "http", "https"):
        raise bad("otlp_endpoint", f"scheme must be http or https, got {scheme!r}")
    cert, key = settings.otlp_client_cert_file, settings.otlp_client_key_file
    if (cert is None) != (key is None):
        missing = "otlp_client_key_file" if key is None else "otlp_client_cert_file"
        raise bad(missing, "mutual TLS needs both otlp_client_cert_file and otlp_client_key_file")
    tls_files = [
        n
        for n, v in (("otlp_ca_file", settings.otlp_ca_file), ("otlp_client_cert_file", cert))
        if v
    ]
    insecure = settings.otlp_insecure
    if insecure is None:
        insecure = scheme == "http" or (scheme == "" and not tls_files)
    if insecure and scheme == "https":
        raise bad("otlp_insecure", f"true contradicts the https:// endpoint {endpoint!r}")
    if not insecure and scheme == "http":
        raise bad("otlp_insecure", f"false (TLS) contradicts the http:// endpoint {endpoint!r}")
    if insecure and tls_files:
        raise bad("otlp_insecure", f"true (plaintext) but {tls_files[0]} is set")
    headers = []
    for name, value in settings.otlp_headers.items():
        low = name.strip().lower()
        if not low or not set(low) <= _METADATA_KEY_CHARS or low.startswith("grpc-"):
            raise bad("otlp_headers", f"{name!r} is not a valid gRPC metadata key")
        headers.append((low, value))
    return OtlpOptions(
        endpoint=endpoint,
        insecure=insecure,
        ca_file=settings.otlp_ca_file,
        client_cert_file=cert,
        client_key_file=key,
        headers=tuple(headers),
        timeout_s=settings.otlp_timeout_s,
    )


def _read_pem(path: Path | None, setting: str, service: str) -> bytes | None:
    if path is None:
        return None
    try:
        return path.expanduser().read_bytes()
    except OSError as err:
        raise SettingsError(
            f"invalid setting {service}.{setting}: cannot read {path}: {err.strerror}"
        ) from err


def _otlp_exporter(opts: OtlpOptions, service: str) -> SpanExporter:
    credentials = None
    if not opts.insecure:
        credentials = grpc.ssl_channel_credentials(
            root_certificates=_read_pem(opts.ca_file, "otlp_ca_file", service),
            private_key=_read_pem(opts.client_key_file, "otlp_client_key_file", service),
            certificate_chain=_read_pem(opts.client_cert_file, "otlp_client_cert_file", service),
        )
    exporter: SpanExporter = OTLPSpanExporter(
        endpoint=opts.endpoint,
        insecure=opts.insecure,
        credentials=credentials,
        headers=opts.headers,
        timeout=opts.timeout_s,
    )
    return exporter


# --------------------------------------------------------------------------- provider


class _ConversationProcessor(SpanProcessor):
    """Copies the ``gen_ai.conversation.id`` baggage entry onto every span it sees start."""

    def on_start(self, span: Span, parent_context: otel_context.Context | None = None) -> None:
        value = baggage.get_baggage(CONVERSATION_ID, parent_context)
        if value:
            span.set_attribute(CONVERSATION_ID, str(value))

    def on_end(self, span: ReadableSpan) -> None:
        return None


def configure_tracing(settings: TracingSettings, service: str) -> TracerProvider:
    """A tracer provider for ``tideserve-<service>`` with the exporter the settings ask for.

    Raises :class:`SettingsError` for OTLP settings that cannot work (see
    :func:`otlp_options`) or an unreadable certificate file. The caller owns the provider
    and should ``shutdown()`` it on exit (which flushes batched spans).
    """
    exporting = settings.trace_exporter != "none"
    provider = TracerProvider(
        resource=Resource.create(
            {"service.name": f"tideserve-{service}", "service.namespace": "tideserve"}
        ),
        sampler=ParentBased(
            TraceIdRatioBased(settings.trace_sample_ratio) if exporting else ALWAYS_OFF
        ),
    )
    add_processors(provider)
    if settings.trace_exporter == "console":
        provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter()))
    elif settings.trace_exporter == "otlp":
        exporter = _otlp_exporter(otlp_options(settings, service), service)
        provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


def quiet_provider() -> TracerProvider:
    """A provider exporting nothing (what ``trace_exporter: none`` builds): trace context
    and propagation, spans recorded only under a caller's sampled ``traceparent``."""
    return add_processors(TracerProvider(sampler=ParentBased(ALWAYS_OFF)))


def add_processors(provider: TracerProvider) -> TracerProvider:
    """Adds the processors every Tideserve provider has (the conversation id from baggage);
    for providers built elsewhere (tests, embedders). Returns ``provider``."""
    provider.add_span_processor(_ConversationProcessor())
    return provider


@contextlib.contextmanager
def conversation(session_id: str) -> Iterator[None]:
    """Within the block, spans started (here and, through ``baggage``, in the services
    the calls reach) carry ``gen_ai.conversation.id = session_id``; no-op for ``""``."""
    if not session_id:
        yield
        return
    token = otel_context.attach(baggage.set_baggage(CONVERSATION_ID, session_id))
    try:
        yield
    finally:
        otel_context.detach(token)


def recording() -> bool:
    """Whether the current span is recorded (sampled, with a recording provider)."""
    return trace.get_current_span().is_recording()


def inject(headers: dict[str, str]) -> dict[str, str]:
    """``headers`` plus the current context's W3C ``traceparent`` (and ``baggage``);
    returns ``headers``."""
    _PROPAGATOR.inject(headers)
    return headers


def trace_ids(span: trace.Span | None = None) -> tuple[str, str, bool]:
    """(trace id, span id, sampled) of ``span`` (default: the current one) as W3C hex;
    ``("", "", False)`` when there is no valid span."""
    ctx = (span or trace.get_current_span()).get_span_context()
    if not ctx.is_valid:
        return "", "", False
    return f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}", ctx.trace_flags.sampled


# --------------------------------------------------------------------------- gRPC


def server_interceptor(provider: TracerProvider) -> grpc.aio.ServerInterceptor:
    """The OpenTelemetry grpc.aio server interceptor: one server span per call, remote parent
    taken from the incoming ``traceparent`` metadata."""
    interceptor: grpc.aio.ServerInterceptor = _OTEL_GRPC.aio_server_interceptor(
        tracer_provider=provider
    )
    return interceptor


def client_interceptors(provider: TracerProvider) -> list[grpc.aio.ClientInterceptor]:
    """OpenTelemetry grpc.aio client interceptors (all four call shapes); they inject
    ``traceparent`` into outgoing metadata."""
    found: Sequence[Any] = _OTEL_GRPC.aio_client_interceptors(tracer_provider=provider)
    return list(found)


# --------------------------------------------------------------------------- aiohttp

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


_METHODS = frozenset({"GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"})


def _span_name(request: web.Request) -> str:
    """``METHOD /route`` (the instrumentation's naming, without its per-call environment
    reads)."""
    method = request.method if request.method in _METHODS else "HTTP"
    try:
        return f"{method} {request.match_info.route.resource.canonical}"  # type: ignore[union-attr]
    except AttributeError:
        return method


def server_middleware(
    provider: TracerProvider, *, exclude: Iterable[str] = (), only: Iterable[str] | None = None
) -> Any:
    """An aiohttp middleware: one SERVER span per request (name ``METHOD /route``, HTTP
    semantic-convention attributes and status from the instrumentation package's helpers),
    child of the incoming ``traceparent`` (and carrying its ``baggage``), current while the
    handler runs. Paths in ``exclude`` (health checks, scrapes), or not in ``only`` when it
    is given, are not traced."""
    tracer = provider.get_tracer(_AIOHTTP_SERVER.__name__, _AIOHTTP_SERVER.__version__)
    skip = frozenset(exclude)
    wanted = frozenset(only) if only is not None else None
    getter = _AIOHTTP_SERVER.getter
    set_status = _AIOHTTP_SERVER.set_status_code
    # A provider whose sampler drops every new trace (trace_exporter none) gives a request
    # without trace headers a non-recording span of fresh ids, as the SDK would: made
    # directly, without the SDK's span machinery (~35 us per request of the gateway's CPU).
    ids = provider.id_generator
    drops_roots = provider.sampler.should_sample(None, 1, "probe").decision == Decision.DROP

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        path = request.path
        if path in skip or (wanted is not None and path not in wanted):
            return await handler(request)
        headers = request.headers
        if drops_roots and "traceparent" not in headers and "baggage" not in headers:
            ctx = trace.SpanContext(ids.generate_trace_id(), ids.generate_span_id(), False)
            token = otel_context.attach(trace.set_span_in_context(trace.NonRecordingSpan(ctx)))
            try:
                return await handler(request)
            finally:
                otel_context.detach(token)
        with tracer.start_as_current_span(
            _span_name(request),
            context=_PROPAGATOR.extract(request, getter=getter),
            kind=trace.SpanKind.SERVER,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            if not span.is_recording():  # unsampled: context and propagation only
                return await handler(request)
            attrs = _AIOHTTP_SERVER.collect_request_attributes(request)
            span.set_attributes(attrs)
            try:
                resp = await handler(request)
            except web.HTTPException as ex:
                set_status(span, ex.status_code, attrs)
                raise
            except Exception as ex:
                set_status(span, type(ex).__qualname__, attrs)
                span.record_exception(ex)
                raise
            set_status(span, resp.status, attrs)
            return resp

    return middleware


def client_trace_config(provider: TracerProvider) -> aiohttp.TraceConfig:
    """An aiohttp ``TraceConfig``: one CLIENT span per call made with the session, child of
    the current span, ``traceparent`` (and ``baggage``) injected into the request headers.
    Under an unrecorded span the call gets no span of its own (the instrumentation's
    attribute work is skipped): the current context is injected as is, so the callee still
    continues the trace. Calls made while HTTP instrumentation is suppressed are left alone.
    HTTP client duration metrics go nowhere (no meter provider)."""
    config: aiohttp.TraceConfig = _AIOHTTP_CLIENT.create_trace_config(
        tracer_provider=provider, meter_provider=NoOpMeterProvider()
    )
    (instrumented,) = config.on_request_start
    config.on_request_start.clear()

    async def on_request_start(
        session: aiohttp.ClientSession, ctx: Any, params: aiohttp.TraceRequestStartParams
    ) -> None:
        if trace.get_current_span().is_recording():
            await instrumented(session, ctx, params)
        elif is_http_instrumentation_enabled():
            _PROPAGATOR.inject(params.headers)

    config.on_request_start.append(on_request_start)
    return config
