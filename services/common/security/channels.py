"""The one place gRPC channels to Tideserve services are made: TLS or plaintext, the token,
the message-size limits and (for grpc.aio) tracing, all from a :class:`ClientSecurity`.

Services build theirs from their own settings (:meth:`ClientSecurity.of`): the same ``tls``
block their server uses (``ca_file`` verifies the peer, ``cert_file``/``key_file`` are the
client certificate), the token in ``auth.token_file`` and ``grpc_limits``. CLIs build theirs
from the same settings (``TIDESERVE_TLS__CA_FILE``, ``TIDESERVE_AUTH__TOKEN_FILE``, or
``tideserve.yaml``) with :func:`client_security`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import grpc
from opentelemetry.sdk.trace import TracerProvider

from services.common.security.credentials import channel_credentials, tls_options
from services.common.security.interceptors import token_channel, token_interceptors
from services.common.security.settings import AuthSettings, GrpcLimits, TlsSettings
from services.common.security.tokens import read_token

__all__ = [
    "ClientSecurity",
    "HasSecurity",
    "aio_channel",
    "client_security",
    "insecure_channel",
    "sync_channel",
]


class HasSecurity(Protocol):
    """What :meth:`ClientSecurity.of` reads (every ServiceSettings has these)."""

    @property
    def tls(self) -> TlsSettings: ...
    @property
    def auth(self) -> AuthSettings: ...
    @property
    def grpc_limits(self) -> GrpcLimits: ...


@dataclass(frozen=True)
class ClientSecurity:
    """How to dial a peer: plaintext with no token by default (today's behaviour)."""

    tls: TlsSettings = field(default_factory=TlsSettings)  # type: ignore[arg-type]
    token: str | None = field(default=None, repr=False)
    limits: GrpcLimits = field(default_factory=GrpcLimits)  # type: ignore[arg-type]

    @classmethod
    def of(cls, settings: HasSecurity) -> ClientSecurity:
        """From a service's (or CLI's) settings; ValueError when the token file is unreadable."""
        path = settings.auth.token_file
        token = read_token(path) if path is not None else None
        return cls(settings.tls, token, settings.grpc_limits)

    def options(self, extra: Sequence[tuple[str, Any]] = ()) -> list[tuple[str, Any]]:
        out: list[tuple[str, Any]] = [*self.limits.channel_options(), *extra]
        if self.tls.enabled:
            out += tls_options(self.tls)
        return out


def client_security(settings: HasSecurity | None) -> ClientSecurity:
    """:meth:`ClientSecurity.of` when settings are given, else the plaintext default."""
    return ClientSecurity() if settings is None else ClientSecurity.of(settings)


def aio_channel(
    target: str,
    security: ClientSecurity | None = None,
    provider: TracerProvider | None = None,
    options: Sequence[tuple[str, Any]] = (),
) -> grpc.aio.Channel:
    """A grpc.aio channel to ``target`` (``host:port``), traced when ``provider`` is given."""
    from services.common.otel import client_interceptors

    sec = security if security is not None else ClientSecurity()
    interceptors: list[grpc.aio.ClientInterceptor] = []
    if sec.token:
        interceptors += token_interceptors(sec.token)
    if provider is not None:
        interceptors += client_interceptors(provider)
    opts = sec.options(options)
    channel: grpc.aio.Channel
    if sec.tls.enabled:
        channel = grpc.aio.secure_channel(
            target, channel_credentials(sec.tls), options=opts, interceptors=interceptors or None
        )
    else:
        channel = grpc.aio.insecure_channel(target, options=opts, interceptors=interceptors or None)
    return channel


def insecure_channel(
    target: str,
    provider: TracerProvider | None = None,
    options: Sequence[tuple[str, Any]] = (),
) -> grpc.aio.Channel:
    """A plaintext grpc.aio channel to ``target`` (``host:port``), traced when ``provider``
    is given (:func:`aio_channel` with no security)."""
    return aio_channel(target, None, provider, options)


def sync_channel(
    target: str,
    security: ClientSecurity | None = None,
    options: Sequence[tuple[str, Any]] = (),
) -> grpc.Channel:
    """A blocking channel to ``target`` (CLIs, the stack's probes)."""
    sec = security if security is not None else ClientSecurity()
    opts = sec.options(options)
    if sec.tls.enabled:
        channel = grpc.secure_channel(target, channel_credentials(sec.tls), options=opts)
    else:
        channel = grpc.insecure_channel(target, options=opts)
    return token_channel(channel, sec.token) if sec.token else channel
