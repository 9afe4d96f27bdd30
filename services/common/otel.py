"""OpenTelemetry: a tracer provider per service and gRPC server/client interceptors.

The provider is built from settings and passed down (never installed as a global):
``trace_exporter`` ``none`` (default: spans are created, W3C ``traceparent`` propagates, nothing
is exported), ``console`` (spans as JSON on stdout) or ``otlp`` (needs ``otlp_endpoint`` and the
optional package ``opentelemetry-exporter-otlp-proto-grpc``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc
from opentelemetry.instrumentation import grpc as _otel_grpc_module
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
)

from services.common.errors import SettingsError
from services.common.settings import ServiceSettings

# The instrumentation package is untyped: reach it through one ``Any`` at the boundary.
_OTEL_GRPC: Any = _otel_grpc_module

__all__ = [
    "client_interceptors",
    "configure_tracing",
    "insecure_channel",
    "server_interceptor",
]


def _otlp_exporter(endpoint: str) -> SpanExporter:
    try:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (  # type: ignore[import-not-found,unused-ignore]
            OTLPSpanExporter,
        )
    except ImportError as err:
        raise SettingsError(
            "invalid setting trace_exporter: otlp needs the package "
            "opentelemetry-exporter-otlp-proto-grpc, which is not installed"
        ) from err
    exporter: SpanExporter = OTLPSpanExporter(endpoint=endpoint, insecure=True)
    return exporter


def configure_tracing(settings: ServiceSettings, service: str) -> TracerProvider:
    """A tracer provider for ``tideserve-<service>`` with the exporter the settings ask for.

    Raises :class:`SettingsError` when ``otlp`` is asked for without an endpoint or package.
    The caller owns the provider and should ``shutdown()`` it on exit.
    """
    provider = TracerProvider(
        resource=Resource.create(
            {"service.name": f"tideserve-{service}", "service.namespace": "tideserve"}
        )
    )
    if settings.trace_exporter == "console":
        provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter()))
    elif settings.trace_exporter == "otlp":
        if not settings.otlp_endpoint:
            raise SettingsError(
                f"invalid setting {service}.otlp_endpoint: required when trace_exporter is otlp"
            )
        provider.add_span_processor(BatchSpanProcessor(_otlp_exporter(settings.otlp_endpoint)))
    return provider


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


def insecure_channel(
    target: str,
    provider: TracerProvider | None = None,
    options: Sequence[tuple[str, Any]] = (),
) -> grpc.aio.Channel:
    """A grpc.aio channel to ``target`` (``host:port``), traced when ``provider`` is given."""
    interceptors = client_interceptors(provider) if provider is not None else None
    channel: grpc.aio.Channel = grpc.aio.insecure_channel(
        target, options=list(options), interceptors=interceptors
    )
    return channel
