"""OTLP exporter settings: the pure rule (:func:`otlp_options`) and the shell that reads
certificate files (:func:`configure_tracing`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from services.common.errors import SettingsError
from services.common.otel import OtlpOptions, configure_tracing, otlp_options
from services.common.settings import load_settings
from services.kvmeta.settings import KVMetaSettings


def settings(**overrides: Any) -> KVMetaSettings:
    return load_settings(KVMetaSettings, "kvmeta", None, {"trace_exporter": "otlp", **overrides})


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"otlp_endpoint": "localhost:4317"}, OtlpOptions("localhost:4317", insecure=True)),
        ({"otlp_endpoint": "http://c:4317"}, OtlpOptions("http://c:4317", insecure=True)),
        ({"otlp_endpoint": "https://c:4317"}, OtlpOptions("https://c:4317", insecure=False)),
        (
            {"otlp_endpoint": "c:4317", "otlp_insecure": False},
            OtlpOptions("c:4317", insecure=False),
        ),
        (
            {"otlp_endpoint": "c:4317", "otlp_ca_file": "/ca.pem"},
            OtlpOptions("c:4317", insecure=False, ca_file=Path("/ca.pem")),
        ),
        (
            {
                "otlp_endpoint": "https://c:4317",
                "otlp_client_cert_file": "/c.pem",
                "otlp_client_key_file": "/k.pem",
                "otlp_headers": {"Authorization": "Bearer x", "x-tenant": "a"},
                "otlp_timeout_s": 2.5,
            },
            OtlpOptions(
                "https://c:4317",
                insecure=False,
                client_cert_file=Path("/c.pem"),
                client_key_file=Path("/k.pem"),
                headers=(("authorization", "Bearer x"), ("x-tenant", "a")),
                timeout_s=2.5,
            ),
        ),
    ],
    ids=["bare-plaintext", "http", "https", "bare-tls-by-flag", "bare-tls-by-ca", "mtls-headers"],
)
def test_otlp_options(overrides: dict[str, Any], expected: OtlpOptions) -> None:
    assert otlp_options(settings(**overrides), "kvmeta") == expected


@pytest.mark.parametrize(
    ("overrides", "error"),
    [
        ({}, "kvmeta.otlp_endpoint: required when trace_exporter is otlp"),
        ({"otlp_endpoint": "  "}, "kvmeta.otlp_endpoint: required"),
        ({"otlp_endpoint": "grpc://c:1"}, "kvmeta.otlp_endpoint: scheme must be http or https"),
        (
            {"otlp_endpoint": "https://c:1", "otlp_insecure": True},
            "kvmeta.otlp_insecure: true contradicts the https:// endpoint",
        ),
        (
            {"otlp_endpoint": "http://c:1", "otlp_insecure": False},
            "kvmeta.otlp_insecure: false .TLS. contradicts the http:// endpoint",
        ),
        (
            {"otlp_endpoint": "c:1", "otlp_insecure": True, "otlp_ca_file": "/ca.pem"},
            "kvmeta.otlp_insecure: true .plaintext. but otlp_ca_file is set",
        ),
        (
            {"otlp_endpoint": "https://c:1", "otlp_client_cert_file": "/c.pem"},
            "kvmeta.otlp_client_key_file: mutual TLS needs both",
        ),
        (
            {"otlp_endpoint": "c:1", "otlp_headers": {"bad key": "v"}},
            "kvmeta.otlp_headers: 'bad key' is not a valid gRPC metadata key",
        ),
    ],
    ids=[
        "no-endpoint",
        "blank-endpoint",
        "bad-scheme",
        "https-insecure",
        "http-tls",
        "plaintext-with-ca",
        "cert-without-key",
        "bad-header",
    ],
)
def test_otlp_options_refused(overrides: dict[str, Any], error: str) -> None:
    with pytest.raises(SettingsError, match=f"invalid setting {error}"):
        otlp_options(settings(**overrides), "kvmeta")


def test_timeout_must_be_positive() -> None:
    with pytest.raises(SettingsError, match=r"kvmeta\.otlp_timeout_s"):
        settings(otlp_endpoint="c:1", otlp_timeout_s=0)


def test_unreadable_ca_file_is_a_settings_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope.pem"
    s = settings(otlp_endpoint="https://c:1", otlp_ca_file=str(missing))
    with pytest.raises(SettingsError, match=f"kvmeta.otlp_ca_file: cannot read {missing}"):
        configure_tracing(s, "kvmeta")


@pytest.mark.parametrize(
    "overrides",
    [
        {"otlp_endpoint": "localhost:4317"},
        {"otlp_endpoint": "https://c:4317", "otlp_ca_file": "CA"},
    ],
    ids=["plaintext", "tls-with-ca"],
)
def test_otlp_provider_builds_without_connecting(overrides: dict[str, Any], tmp_path: Path) -> None:
    if overrides.get("otlp_ca_file") == "CA":
        ca = tmp_path / "ca.pem"
        ca.write_text("-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n")
        overrides = {**overrides, "otlp_ca_file": str(ca)}
    provider = configure_tracing(settings(**overrides), "kvmeta")
    try:
        assert provider.resource.attributes["service.name"] == "tideserve-kvmeta"
    finally:
        provider.shutdown()


SAMPLED_PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.mark.parametrize(
    ("overrides", "traceparent", "recorded"),
    [
        ({"trace_exporter": "none"}, None, False),
        ({"trace_exporter": "none"}, SAMPLED_PARENT, True),
        ({"trace_exporter": "console"}, None, True),
        ({"trace_exporter": "console", "trace_sample_ratio": 0.0}, None, False),
        ({"trace_exporter": "console", "trace_sample_ratio": 0.0}, SAMPLED_PARENT, True),
    ],
    ids=["none", "none-sampled-caller", "console", "ratio-0", "ratio-0-sampled-caller"],
)
def test_sampling(overrides: dict[str, Any], traceparent: str | None, recorded: bool) -> None:
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    provider = configure_tracing(load_settings(KVMetaSettings, "kvmeta", None, overrides), "kvmeta")
    parent = TraceContextTextMapPropagator().extract(
        {"traceparent": traceparent} if traceparent else {}
    )
    span = provider.get_tracer("t").start_span("req", context=parent)
    assert span.is_recording() == recorded
    assert span.get_span_context().is_valid  # trace ids for records and logs either way
    span.end()
    provider.shutdown()
