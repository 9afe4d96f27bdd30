"""Service settings: one pydantic-settings object per service, built in ``main``, passed down.

Sources, lowest to highest precedence (later wins, key by key):

1. field defaults of the settings class;
2. the YAML file: top-level common keys, then the service's own section
   (``kvmeta: {grpc_port: 50052}``) which overrides them;
3. environment: ``TIDESERVE_<FIELD>`` (common), then ``TIDESERVE_<SERVICE>__<FIELD>``;
4. explicit overrides (command-line flags); ``None`` values are ignored.

The YAML path is ``config_path`` if given, else ``$TIDESERVE_CONFIG``, else ``./tideserve.yaml``
when that file exists. Nothing is read at import time.
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml
from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, EnvSettingsSource, SettingsConfigDict
from pydantic_settings import SettingsError as PydanticSettingsError

from services.common.errors import SettingsError
from services.common.redis_client import RedisClientOptions
from services.common.security.settings import AuthSettings, GrpcLimits, TlsSettings

__all__ = [
    "DEFAULT_CONFIG_FILE",
    "ENV_PREFIX",
    "ServiceSettings",
    "SettingsError",
    "TracingSettings",
    "add_common_arguments",
    "load_settings",
    "overrides_from_args",
]

ENV_PREFIX = "TIDESERVE_"
DEFAULT_CONFIG_FILE = "tideserve.yaml"

S = TypeVar("S", bound="ServiceSettings")


def _default_state_dir() -> Path:
    return Path.home() / ".local" / "share" / "tideserve"


class TracingSettings(BaseSettings):
    """OpenTelemetry tracing, shared by the services and the engine simulator
    (:func:`services.common.otel.configure_tracing` builds the tracer provider from it).

    ``trace_exporter``: ``none`` (trace context is created and W3C ``traceparent``
    propagates, so request records and log lines carry trace ids, but spans are recorded
    only when a caller's ``traceparent`` asks for it, and nothing is exported), ``console``
    (spans as JSON on stdout) or ``otlp`` (OTLP/gRPC to ``otlp_endpoint``). With an
    exporter, ``trace_sample_ratio`` of the new traces are recorded (parent-based: a caller's
    sampling decision is followed).

    OTLP transport: ``https://host:port`` means TLS and ``http://host:port`` plaintext; a bare
    ``host:port`` is plaintext unless ``otlp_insecure`` is false or a CA / client certificate
    is given. TLS verifies the collector against ``otlp_ca_file`` (default: the system roots)
    and authenticates with ``otlp_client_cert_file`` + ``otlp_client_key_file`` (both or
    neither). ``otlp_headers`` go with every export (e.g. ``{authorization: "Bearer ..."}``;
    keys are lower-cased, as gRPC metadata needs). OTLP over HTTP/protobuf is not supported
    (it would need ``opentelemetry-exporter-otlp-proto-http``); run a collector's gRPC
    receiver. Contradictions (``https://`` with ``otlp_insecure: true``, a key without a
    certificate, an unreadable file) are a :class:`SettingsError` at startup.
    """

    trace_exporter: Literal["none", "console", "otlp"] = Field(
        "none", description="where OpenTelemetry spans go; otlp needs otlp_endpoint"
    )
    otlp_endpoint: str | None = Field(
        None, description="OTLP/gRPC collector: host:port, http://host:port or https://host:port"
    )
    otlp_insecure: bool | None = Field(
        None,
        description="plaintext (true) or TLS (false); None = from the endpoint's scheme and "
        "whether TLS files are given",
    )
    otlp_ca_file: Path | None = Field(
        None, description="PEM CA bundle the collector's certificate is checked against"
    )
    otlp_client_cert_file: Path | None = Field(
        None, description="PEM client certificate (mutual TLS; needs otlp_client_key_file)"
    )
    otlp_client_key_file: Path | None = Field(
        None, description="PEM private key of otlp_client_cert_file"
    )
    otlp_headers: dict[str, str] = Field(
        default_factory=dict, repr=False, description="metadata sent with every export"
    )
    otlp_timeout_s: float = Field(10.0, gt=0.0, description="deadline of one export call")
    trace_sample_ratio: float = Field(
        1.0,
        ge=0.0,
        le=1.0,
        description="fraction of new traces recorded (console/otlp); a caller's sampled "
        "traceparent is always followed",
    )

    @field_validator("otlp_endpoint", mode="before")
    @classmethod
    def _blank_endpoint_is_none(cls, value: Any) -> Any:
        return None if isinstance(value, str) and not value.strip() else value


class ServiceSettings(TracingSettings):
    """Settings common to every service. Subclasses set per-service defaults and add fields."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="__",
        extra="ignore",
        validate_default=True,
    )

    host: str = Field("127.0.0.1", min_length=1, description="interface the service binds")
    grpc_port: int = Field(0, ge=0, le=65535, description="gRPC port; 0 picks a free port")
    metrics_port: int = Field(0, ge=0, le=65535, description="Prometheus /metrics; 0 = off")
    postgres_url: str | None = Field(None, description="postgresql:// URL; None = no database")
    redis_url: str | None = Field(None, description="redis:// URL; None = no streams")
    stream_prefix: str = Field("ts", min_length=1, description="prefix of Redis stream names")
    redis_client: RedisClientOptions = Field(
        default_factory=RedisClientOptions,
        description="timeouts, health checks and retries of the Redis clients",
    )
    stream_max_attempts: int = Field(
        5,
        ge=1,
        le=1000,
        description="deliveries of a stream entry whose handler keeps failing (not for a "
        "dependency being down) before it goes to the dead letters",
    )
    log_level: str = Field("INFO", description="DEBUG, INFO, WARNING, ERROR or CRITICAL")
    log_format: Literal["json", "text"] = "json"
    shutdown_grace_s: float = Field(5.0, ge=0.0, description="time in-flight calls get to finish")
    state_dir: Path = Field(default_factory=_default_state_dir)
    tls: TlsSettings = Field(
        default_factory=TlsSettings,  # type: ignore[arg-type]
        description="gRPC TLS / mutual TLS (services.common.security)",
    )
    auth: AuthSettings = Field(
        default_factory=AuthSettings,  # type: ignore[arg-type]
        description="gRPC token authentication with roles",
    )
    grpc_limits: GrpcLimits = Field(
        default_factory=GrpcLimits,  # type: ignore[arg-type]
        description="gRPC message sizes and list lengths",
    )
    reflection: bool = Field(True, description="serve gRPC server reflection")

    @field_validator("log_level")
    @classmethod
    def _check_level(cls, value: str) -> str:
        level = value.strip().upper()
        if level not in logging.getLevelNamesMapping():
            raise ValueError("should be one of DEBUG, INFO, WARNING, ERROR, CRITICAL")
        return level

    @field_validator("state_dir")
    @classmethod
    def _expand_state_dir(cls, value: Path) -> Path:
        return value.expanduser()

    @field_validator("postgres_url", "redis_url", mode="before")
    @classmethod
    def _empty_is_none(cls, value: Any) -> Any:
        return None if isinstance(value, str) and not value.strip() else value


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise SettingsError(f"invalid setting config: cannot read {path}: {err.strerror}") from err
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or "parse error"
        raise SettingsError(f"invalid setting config: {path}{where}: {problem}") from err
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise SettingsError(f"invalid setting config: {path}: top level must be a mapping")
    return data


def _resolve_config_path(config_path: str | os.PathLike[str] | None) -> Path | None:
    if config_path is not None and str(config_path):
        return Path(config_path).expanduser()
    from_env = os.environ.get(f"{ENV_PREFIX}CONFIG", "")
    if from_env:
        return Path(from_env).expanduser()
    default = Path(DEFAULT_CONFIG_FILE)
    return default if default.is_file() else None


def _file_values(
    cls: type[ServiceSettings], service: str, path: Path | None
) -> tuple[dict[str, Any], dict[str, str]]:
    """Common keys overlaid with the service section; also where each key came from."""
    if path is None:
        return {}, {}
    data = _read_yaml(path)
    fields = cls.model_fields
    values: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for key, value in data.items():
        # Mappings under names that are not fields are other components' sections.
        if key in fields:
            values[key] = value
            origin[key] = f"{path}"
    section = data.get(service)
    if section is None:
        return values, origin
    if not isinstance(section, dict):
        raise SettingsError(f"invalid setting {service}: section in {path} must be a mapping")
    for key, value in section.items():
        if key not in fields:
            raise SettingsError(f"invalid setting {service}.{key}: unknown setting (in {path})")
        values[key] = value
        origin[key] = f"{path} [{service}]"
    return values, origin


def _env_values(cls: type[ServiceSettings], prefix: str) -> dict[str, Any]:
    source = EnvSettingsSource(cls, env_prefix=prefix, env_nested_delimiter="__")
    return {k: v for k, v in source().items() if k in cls.model_fields}


def _describe(err: ValidationError, service: str, origin: Mapping[str, str]) -> str:
    first = err.errors()[0]
    loc = ".".join(str(part) for part in first["loc"]) or "?"
    top = str(first["loc"][0]) if first["loc"] else ""
    where = f" (from {origin[top]})" if top in origin else ""
    given = ""
    if "input" in first and not isinstance(first["input"], dict | list):
        given = f", got {first['input']!r}"
    more = len(err.errors()) - 1
    extra = f" (+{more} more)" if more > 0 else ""
    return f"invalid setting {service}.{loc}{where}: {first['msg']}{given}{extra}"


def load_settings(
    cls: type[S],
    service: str,
    config_path: str | os.PathLike[str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> S:
    """Build ``cls`` from file < env < overrides (see module doc).

    Raises :class:`SettingsError` with one line naming the bad setting, e.g.
    ``invalid setting kvmeta.grpc_port (from env TIDESERVE_GRPC_PORT): Input should be a
    valid integer, unable to parse string as an integer, got 'abc'``.
    """
    path = _resolve_config_path(config_path)
    values, origin = _file_values(cls, service, path)
    layers = (
        (ENV_PREFIX, "env " + ENV_PREFIX),
        (f"{ENV_PREFIX}{service.upper()}__", f"env {ENV_PREFIX}{service.upper()}__"),
    )
    for prefix, label in layers:
        try:
            env = _env_values(cls, prefix)
        except PydanticSettingsError as err:
            raise SettingsError(f"invalid setting {service} (environment {label}*): {err}") from err
        for key, value in env.items():
            values[key] = value
            origin[key] = f"{label}{key.upper()}"
    for key, value in (overrides or {}).items():
        if value is None:
            continue
        if key not in cls.model_fields:
            raise SettingsError(f"invalid setting {service}.{key}: unknown setting")
        values[key] = value
        origin[key] = "command line"
    try:
        return cls.model_validate(values)
    except ValidationError as err:
        raise SettingsError(_describe(err, service, origin)) from err


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--config --host --grpc-port --metrics-port --postgres-url --redis-url
    --log-level --log-format --state-dir`` (all default to None = not given)."""
    parser.add_argument("--config", metavar="FILE", help="YAML settings file")
    parser.add_argument("--host", help="interface to bind (default 127.0.0.1)")
    parser.add_argument("--grpc-port", type=str, metavar="N", help="gRPC port (0 = any free)")
    parser.add_argument("--metrics-port", type=str, metavar="N", help="metrics port (0 = off)")
    parser.add_argument("--postgres-url", metavar="URL", help="postgresql:// URL")
    parser.add_argument("--redis-url", metavar="URL", help="redis:// URL")
    parser.add_argument("--log-level", help="DEBUG, INFO, WARNING, ERROR")
    parser.add_argument("--log-format", help="json or text")
    parser.add_argument("--state-dir", metavar="DIR", help="state directory")


_COMMON_FLAGS: Sequence[str] = (
    "host",
    "grpc_port",
    "metrics_port",
    "postgres_url",
    "redis_url",
    "log_level",
    "log_format",
    "state_dir",
)


def overrides_from_args(args: argparse.Namespace, extra: Sequence[str] = ()) -> dict[str, Any]:
    """Settings overrides from parsed flags: only the flags actually given (not None).

    Values stay strings so that a bad one is reported by :func:`load_settings` as a setting.
    """
    out: dict[str, Any] = {}
    for name in (*_COMMON_FLAGS, *extra):
        value = getattr(args, name, None)
        if value is not None:
            out[name] = value
    return out
