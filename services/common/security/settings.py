"""Security settings of every gRPC server and client: TLS, token auth, message and list limits.

They are fields of :class:`services.common.settings.ServiceSettings` (``tls``, ``auth``,
``grpc_limits``, ``reflection``), so every service and CLI takes them the same way, e.g.
``TIDESERVE_TLS__CERT_FILE=/etc/tideserve/tls.crt`` or, in ``tideserve.yaml``::

    tls: {cert_file: tls.crt, key_file: tls.key, ca_file: ca.crt, client_auth: true}
    auth: {enabled: true, tokens_file: tokens, token_file: my.token}

One block serves both directions: a service's server uses ``cert_file``/``key_file`` and
checks client certificates against ``ca_file`` (``client_auth``); its channels to its peers
verify them against ``ca_file`` and present ``cert_file``/``key_file`` as the client
certificate (so the certificate should carry both the serverAuth and clientAuth usages, as
mesh certificates do) and send the token read from ``auth.token_file``.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["AuthSettings", "GrpcLimits", "TlsSettings"]

MIB = 1024 * 1024


class TlsSettings(BaseModel):
    """TLS of the gRPC server and of the channels to peers. ``enabled`` without files is a
    settings error. The server re-reads ``cert_file``/``key_file``/``ca_file`` when they
    change (checked at each new connection), so a renewed certificate is served without a
    restart; channels read them when they are made."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(False, description="serve and dial gRPC over TLS")
    cert_file: Path | None = Field(None, description="PEM certificate chain (server and client)")
    key_file: Path | None = Field(None, description="PEM private key of cert_file")
    ca_file: Path | None = Field(
        None, description="PEM CA bundle peers are verified against (None: system roots)"
    )
    client_auth: bool = Field(
        False,
        description="mutual TLS: the server refuses clients without a certificate from ca_file",
    )
    server_name: str | None = Field(
        None, description="name checked against the server certificate (default: the target host)"
    )

    @model_validator(mode="after")
    def _consistent(self) -> TlsSettings:
        if not self.enabled:
            return self
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("tls.cert_file and tls.key_file go together")
        if self.client_auth and self.ca_file is None:
            raise ValueError("tls.client_auth needs tls.ca_file (the CA of client certificates)")
        return self


class AuthSettings(BaseModel):
    """Token authentication with roles (see :mod:`services.common.security.auth`).

    Server: with ``enabled``, every RPC needs a token from ``tokens_file`` whose role is at
    least the one the service's access table gives the method; read and decision RPCs need
    none when ``open_reads``. Health checks are always open. Client: the token in
    ``token_file`` (one line) is sent as ``authorization: Bearer <token>`` on every call."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(False, description="refuse calls without a valid token")
    tokens_file: Path | None = Field(
        None, description="server: lines 'NAME ROLE sha256:HEX' (re-read when it changes)"
    )
    open_reads: bool = Field(False, description="read and decision RPCs need no token")
    token_file: Path | None = Field(None, description="client: the token sent to peers")

    @model_validator(mode="after")
    def _consistent(self) -> AuthSettings:
        if self.enabled and self.tokens_file is None:
            raise ValueError("auth.enabled needs auth.tokens_file")
        return self


class GrpcLimits(BaseModel):
    """Bounds on what one gRPC message may carry, on servers and channels alike.

    ``max_list_length`` bounds every repeated field of a request (nested ones too; a
    longer one is INVALID_ARGUMENT naming the field); ``list_lengths`` overrides it per
    field, keyed by the field's full name (``tideserve.v1.PickRequest.token_ids``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_receive_message_bytes: int = Field(16 * MIB, gt=0, description="largest message read")
    max_send_message_bytes: int = Field(16 * MIB, gt=0, description="largest message written")
    max_list_length: int = Field(
        1_048_576, gt=0, description="most entries in one repeated field of a request"
    )
    list_lengths: dict[str, int] = Field(
        default_factory=dict, description="per-field bound: full field name -> entries"
    )

    def channel_options(self) -> list[tuple[str, int]]:
        """The grpc options that set these sizes (servers and channels take the same)."""
        return [
            ("grpc.max_receive_message_length", self.max_receive_message_bytes),
            ("grpc.max_send_message_length", self.max_send_message_bytes),
        ]
