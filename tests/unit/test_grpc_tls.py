"""TLS, mutual TLS and certificate reload through the real service runner, with a CA and
certificates made at test time."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc
import pytest
from tideserve.v1 import telemetry_pb2, telemetry_pb2_grpc

from services.common.security.access import AccessTable, Role
from services.common.security.channels import ClientSecurity, aio_channel, sync_channel
from services.common.security.settings import TlsSettings
from tests.helpers.certs import TestCA
from tests.helpers.secured import SERVICE, secured
from tests.helpers.waits import eventually

pytestmark = pytest.mark.asyncio

TABLE = AccessTable(SERVICE, {"QueryWindow": Role.READ})


class Files:
    def __init__(self, root: Path, ca: TestCA) -> None:
        self.root = root
        self.ca = root / "ca.crt"
        self.ca.write_bytes(ca.pem)
        self.cert, self.key = root / "tls.crt", root / "tls.key"
        ca.issue("server").write(self.cert, self.key)
        self.client_cert, self.client_key = root / "client.crt", root / "client.key"
        ca.issue("client").write(self.client_cert, self.client_key)

    def server(self, client_auth: bool) -> dict[str, Any]:
        return {
            "tls": {
                "enabled": True,
                "cert_file": self.cert,
                "key_file": self.key,
                "ca_file": self.ca,
                "client_auth": client_auth,
            }
        }

    def client(self, with_cert: bool, ca: Path | None = None) -> ClientSecurity:
        cert = {"cert_file": self.client_cert, "key_file": self.client_key} if with_cert else {}
        return ClientSecurity(TlsSettings(enabled=True, ca_file=ca or self.ca, **cert))


async def _query(port: int, security: ClientSecurity | None) -> grpc.StatusCode:
    async with aio_channel(f"127.0.0.1:{port}", security) as ch:
        try:
            await telemetry_pb2_grpc.TelemetryServiceStub(ch).QueryWindow(
                telemetry_pb2.QueryWindowRequest(), timeout=5
            )
        except grpc.aio.AioRpcError as err:
            return err.code()
    return grpc.StatusCode.OK


OK = grpc.StatusCode.OK
UNAVAILABLE = grpc.StatusCode.UNAVAILABLE

CASES = [
    ("tls: client verifies the server", False, "tls", OK),
    ("tls: plaintext client cannot talk", False, "plain", UNAVAILABLE),
    ("mtls: client with a certificate", True, "cert", OK),
    ("mtls: client without a certificate is refused", True, "tls", UNAVAILABLE),
]


@pytest.mark.parametrize(
    ("client_auth", "client", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
async def test_tls_and_mutual_tls(
    tmp_path: Path, client_auth: bool, client: str, expected: grpc.StatusCode
) -> None:
    files = Files(tmp_path, TestCA())
    security = {"tls": files.client(False), "cert": files.client(True), "plain": None}[client]
    async with secured(files.server(client_auth), [TABLE]) as port:
        assert await _query(port, security) == expected


async def test_a_renewed_certificate_is_served_without_restart(tmp_path: Path) -> None:
    old_ca, new_ca = TestCA("old-ca"), TestCA("new-ca")
    files = Files(tmp_path, old_ca)
    new_ca_file = tmp_path / "new-ca.crt"
    new_ca_file.write_bytes(new_ca.pem)
    trusts_new = files.client(False, ca=new_ca_file)
    async with secured(files.server(False), [TABLE]) as port:
        assert await _query(port, files.client(False)) == OK
        assert await _query(port, trusts_new) == UNAVAILABLE  # still the old certificate
        new_ca.issue("server").write(files.cert, files.key)

        async def renewed() -> bool:
            return await _query(port, trusts_new) == OK

        await eventually(renewed)
        assert await _query(port, files.client(False)) == UNAVAILABLE


async def test_sync_channel_with_mutual_tls(tmp_path: Path) -> None:
    files = Files(tmp_path, TestCA())
    async with secured(files.server(True), [TABLE]) as port:
        security = files.client(True)
        with sync_channel(f"127.0.0.1:{port}", security) as ch:
            future = telemetry_pb2_grpc.TelemetryServiceStub(ch).QueryWindow.future(
                telemetry_pb2.QueryWindowRequest(), timeout=5
            )
            resp = await asyncio.to_thread(future.result)
    assert isinstance(resp, telemetry_pb2.QueryWindowResponse)


async def test_unreadable_files_are_a_startup_error(tmp_path: Path) -> None:
    from services.common.security.credentials import server_credentials

    missing = TlsSettings(enabled=True, cert_file=tmp_path / "no.crt", key_file=tmp_path / "no.key")
    with pytest.raises(ValueError, match=r"tls.cert_file .*no.crt"):
        server_credentials(missing)
