"""OTLP export as configured by settings reaches a collector: a fake OTLP/gRPC trace
receiver in this process (plaintext, and TLS with a CA file and a self-signed certificate
made by ``openssl``) gets the spans, the service's resource and the configured headers."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from services.common.otel import configure_tracing
from services.common.settings import load_settings
from services.kvmeta.settings import KVMetaSettings

pytestmark = pytest.mark.integration


@dataclass
class Collector(trace_service_pb2_grpc.TraceServiceServicer):  # type: ignore[misc]
    requests: list[Any] = field(default_factory=list)
    metadata: list[dict[str, str]] = field(default_factory=list)

    def Export(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.requests.append(request)
        self.metadata.append({m.key: m.value for m in context.invocation_metadata()})
        return trace_service_pb2.ExportTraceServiceResponse()


@pytest.fixture
def collector() -> Iterator[tuple[Collector, grpc.Server]]:
    c = Collector()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(c, server)
    yield c, server
    server.stop(None)


def _self_signed(tmp: Path) -> tuple[bytes, bytes]:
    if shutil.which("openssl") is None:
        pytest.skip("the TLS case makes its certificate with the openssl command, not installed")
    key, cert = tmp / "key.pem", tmp / "cert.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-keyout", str(key), "-out", str(cert), "-subj", "/CN=localhost"),
            *("-addext", "subjectAltName=DNS:localhost"),
        ],
        check=True,
        capture_output=True,
    )
    return key.read_bytes(), cert.read_bytes()


@pytest.mark.parametrize("tls", [False, True], ids=["plaintext", "tls-with-ca-file"])
def test_spans_reach_the_collector_with_headers(
    collector: tuple[Collector, grpc.Server], tmp_path: Path, tls: bool
) -> None:
    c, server = collector
    overrides: dict[str, Any] = {
        "trace_exporter": "otlp",
        "otlp_headers": {"X-Tenant-Token": "t0ken"},
        "otlp_timeout_s": 5,
    }
    if tls:
        key, cert = _self_signed(tmp_path)
        creds = grpc.ssl_server_credentials([(key, cert)])
        port = server.add_secure_port("localhost:0", creds)
        (tmp_path / "ca.pem").write_bytes(cert)
        overrides |= {
            "otlp_endpoint": f"https://localhost:{port}",
            "otlp_ca_file": str(tmp_path / "ca.pem"),
        }
    else:
        port = server.add_insecure_port("127.0.0.1:0")
        overrides["otlp_endpoint"] = f"127.0.0.1:{port}"
    server.start()
    provider = configure_tracing(load_settings(KVMetaSettings, "kvmeta", None, overrides), "kvmeta")
    with provider.get_tracer("t").start_as_current_span("exported"):
        pass
    assert provider.force_flush(10_000)
    provider.shutdown()
    spans = [
        (rs.resource, s.name)
        for req in c.requests
        for rs in req.resource_spans
        for ss in rs.scope_spans
        for s in ss.spans
    ]
    assert [name for _, name in spans] == ["exported"]
    attrs = {a.key: a.value.string_value for a in spans[0][0].attributes}
    assert attrs["service.name"] == "tideserve-kvmeta"
    assert c.metadata[0]["x-tenant-token"] == "t0ken"
