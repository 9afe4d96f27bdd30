"""The one place gRPC server and channel credentials are built from :class:`TlsSettings`.

Server: :func:`server_credentials` returns grpc's dynamic SSL credentials whose certificate
fetcher (:class:`CertificateFiles`) re-reads the certificate, key and CA files whenever one
of them changed (size, mtime or inode; grpc asks at each new handshake), so a renewed
certificate is served to new connections without a restart; a half-written pair that does
not load keeps the previous one. Channel: :func:`channel_credentials` reads the files once.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import grpc

from services.common.security.settings import TlsSettings
from services.common.security.tokens import file_stamp

__all__ = ["CertificateFiles", "channel_credentials", "server_credentials", "tls_options"]

log = logging.getLogger(__name__)

_Stamp = tuple[tuple[int, int, int], ...]


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as err:
        raise ValueError(f"tls.{what} {path}: {err.strerror or err}") from err


@dataclass(frozen=True)
class _Material:
    cert: bytes
    key: bytes
    ca: bytes | None


class CertificateFiles:
    """The server's certificate, key and CA files, loaded again when one of them changes."""

    def __init__(self, settings: TlsSettings) -> None:
        if settings.cert_file is None or settings.key_file is None:
            raise ValueError("a TLS server needs tls.cert_file and tls.key_file")
        self._cert = settings.cert_file
        self._key = settings.key_file
        self._ca = settings.ca_file
        self._stamp = self._files_stamp()
        self.material = self._load()
        self.loads = 1

    def _paths(self) -> tuple[Path, ...]:
        return tuple(p for p in (self._cert, self._key, self._ca) if p is not None)

    def _files_stamp(self) -> _Stamp:
        return tuple(file_stamp(path) for path in self._paths())

    def _load(self) -> _Material:
        ca = _read(self._ca, "ca_file") if self._ca is not None else None
        return _Material(_read(self._cert, "cert_file"), _read(self._key, "key_file"), ca)

    def configuration(self) -> grpc.ServerCertificateConfiguration:
        m = self.material
        return grpc.ssl_server_certificate_configuration([(m.key, m.cert)], m.ca)

    def fetch(self) -> grpc.ServerCertificateConfiguration | None:
        """grpc's fetcher: a new configuration when the files changed, else None (keep)."""
        stamp = self._files_stamp()
        if stamp == self._stamp:
            return None
        try:
            material = self._load()
            config = grpc.ssl_server_certificate_configuration(
                [(material.key, material.cert)], material.ca
            )
        except (ValueError, RuntimeError) as err:
            log.warning("TLS files changed but do not load; keeping the old ones: %s", err)
            return None
        self._stamp = stamp
        self.material = material
        self.loads += 1
        log.info("TLS certificate reloaded", extra={"cert_file": str(self._cert)})
        return config


def server_credentials(settings: TlsSettings) -> grpc.ServerCredentials:
    """Dynamic SSL server credentials (mutual TLS when ``settings.client_auth``)."""
    files = CertificateFiles(settings)
    return grpc.dynamic_ssl_server_credentials(
        files.configuration(), files.fetch, require_client_authentication=settings.client_auth
    )


def channel_credentials(settings: TlsSettings) -> grpc.ChannelCredentials:
    """SSL channel credentials: verify against ``ca_file`` (None: system roots), present
    ``cert_file``/``key_file`` when both are set."""
    ca = _read(settings.ca_file, "ca_file") if settings.ca_file is not None else None
    cert = key = None
    if settings.cert_file is not None and settings.key_file is not None:
        cert = _read(settings.cert_file, "cert_file")
        key = _read(settings.key_file, "key_file")
    return grpc.ssl_channel_credentials(ca, key, cert)


def tls_options(settings: TlsSettings) -> list[tuple[str, str]]:
    """Channel options TLS needs (the name checked against the server's certificate)."""
    if settings.server_name:
        return [("grpc.ssl_target_name_override", settings.server_name)]
    return []
