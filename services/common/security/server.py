"""What the security settings add to a gRPC server (:func:`server_security`), used by
:func:`services.common.server.serve` for every service.

- ``tls.enabled``: the port is bound with :func:`~.credentials.server_credentials` (reloaded
  certificates; client certificates required when ``tls.client_auth``);
- ``auth.enabled``: :class:`~.interceptors.AuthInterceptor` over the service's access
  tables (a method in no table is refused);
- always: :class:`~.interceptors.ListLimitInterceptor` and the ``grpc_limits`` message sizes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from services.common.security.access import AccessTable, policy_of
from services.common.security.credentials import server_credentials
from services.common.security.interceptors import AuthInterceptor, ListLimitInterceptor
from services.common.security.limits import ListBounds
from services.common.security.settings import AuthSettings, GrpcLimits, TlsSettings
from services.common.security.tokens import TokenFile

__all__ = ["ServerSecurity", "server_security"]


@dataclass(frozen=True)
class ServerSecurity:
    interceptors: tuple[grpc.aio.ServerInterceptor, ...]
    credentials: grpc.ServerCredentials | None
    options: tuple[tuple[str, Any], ...]

    def bind(self, server: grpc.aio.Server, address: str) -> int:
        """Add the listening port (TLS when configured); the bound port."""
        if self.credentials is not None:
            return int(server.add_secure_port(address, self.credentials))
        return int(server.add_insecure_port(address))


def server_security(
    tls: TlsSettings,
    auth: AuthSettings,
    limits: GrpcLimits,
    tables: Sequence[AccessTable],
    *,
    reflection: bool,
    clock: Callable[[], float] = time.monotonic,
) -> ServerSecurity:
    """Interceptors, credentials and options from the settings. Raises ValueError (a
    startup error naming the setting) for unreadable certificate or token files."""
    interceptors: list[grpc.aio.ServerInterceptor] = []
    if auth.enabled:
        assert auth.tokens_file is not None  # AuthSettings validates it
        tokens = TokenFile(auth.tokens_file, clock)
        policy = policy_of(tables, reflection=reflection)
        interceptors.append(AuthInterceptor(policy, tokens, open_reads=auth.open_reads))
    interceptors.append(
        ListLimitInterceptor(ListBounds(limits.max_list_length, dict(limits.list_lengths)))
    )
    creds = server_credentials(tls) if tls.enabled else None
    return ServerSecurity(tuple(interceptors), creds, tuple(limits.channel_options()))
