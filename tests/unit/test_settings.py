"""Settings: defaults per service, precedence file < env < overrides, one-line errors."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from services.autoscaler.settings import AutoscalerSettings
from services.common.settings import (
    ServiceSettings,
    SettingsError,
    add_common_arguments,
    load_settings,
    overrides_from_args,
)
from services.kvmeta.settings import KVMetaSettings
from services.scheduler.settings import SchedulerSettings
from services.telemetry.settings import TelemetrySettings


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No TIDESERVE_* from the outer environment and no ./tideserve.yaml in the cwd."""
    import os

    for key in list(os.environ):
        if key.upper().startswith("TIDESERVE_"):
            monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)


def write(tmp_path: Path, text: str, name: str = "conf.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("cls", "service", "grpc_port", "metrics_port"),
    [
        (SchedulerSettings, "scheduler", 50051, 9101),
        (KVMetaSettings, "kvmeta", 50052, 9102),
        (AutoscalerSettings, "autoscaler", 50053, 9103),
        (TelemetrySettings, "telemetry", 50054, 9104),
    ],
    ids=["scheduler", "kvmeta", "autoscaler", "telemetry"],
)
def test_service_defaults(
    cls: type[ServiceSettings], service: str, grpc_port: int, metrics_port: int
) -> None:
    settings = load_settings(cls, service, None, {})
    assert (settings.host, settings.grpc_port, settings.metrics_port) == (
        "127.0.0.1",
        grpc_port,
        metrics_port,
    )
    assert settings.postgres_url is None and settings.redis_url is None
    assert settings.stream_prefix == "ts"
    assert settings.log_format == "json"
    assert settings.shutdown_grace_s == 5.0


def test_extra_defaults() -> None:
    assert load_settings(SchedulerSettings, "scheduler").http_port == 8000
    assert load_settings(KVMetaSettings, "kvmeta").metadata_http_port == 8081


# Each case: yaml text, env, overrides → expected grpc_port.
PRECEDENCE = [
    ("", {}, {}, 50052),
    ("grpc_port: 1001\n", {}, {}, 1001),
    ("grpc_port: 1001\nkvmeta:\n  grpc_port: 1002\n", {}, {}, 1002),
    ("grpc_port: 1001\nscheduler:\n  grpc_port: 1003\n", {}, {}, 1001),
    ("kvmeta:\n  grpc_port: 1002\n", {"TIDESERVE_GRPC_PORT": "2001"}, {}, 2001),
    (
        "kvmeta:\n  grpc_port: 1002\n",
        {"TIDESERVE_GRPC_PORT": "2001", "TIDESERVE_KVMETA__GRPC_PORT": "2002"},
        {},
        2002,
    ),
    ("", {"TIDESERVE_SCHEDULER__GRPC_PORT": "2003"}, {}, 50052),
    ("kvmeta:\n  grpc_port: 1002\n", {"TIDESERVE_GRPC_PORT": "2001"}, {"grpc_port": "3001"}, 3001),
    ("grpc_port: 1001\n", {}, {"grpc_port": None}, 1001),
]


@pytest.mark.parametrize(
    ("yaml_text", "env", "overrides", "expected"),
    PRECEDENCE,
    ids=[
        "default",
        "file-common",
        "file-section-beats-common",
        "other-section-ignored",
        "env-beats-file",
        "service-env-beats-common-env",
        "other-service-env-ignored",
        "override-beats-env",
        "none-override-ignored",
    ],
)
def test_precedence(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    yaml_text: str,
    env: dict[str, str],
    overrides: dict[str, Any],
    expected: int,
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    config = write(tmp_path, yaml_text) if yaml_text else None
    settings = load_settings(KVMetaSettings, "kvmeta", config, overrides)
    assert settings.grpc_port == expected


def test_file_sets_many_keys_and_keeps_other_defaults(tmp_path: Path) -> None:
    config = write(
        tmp_path,
        "redis_url: redis://127.0.0.1:1/0\nlog_level: debug\nkvmeta:\n  log_format: text\n",
    )
    settings = load_settings(KVMetaSettings, "kvmeta", config, {})
    assert settings.redis_url == "redis://127.0.0.1:1/0"
    assert settings.log_level == "DEBUG"
    assert settings.log_format == "text"
    assert settings.grpc_port == 50052


def test_config_path_from_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TIDESERVE_CONFIG", str(write(tmp_path, "grpc_port: 4001\n", "x.yaml")))
    assert load_settings(KVMetaSettings, "kvmeta").grpc_port == 4001


def test_default_config_file_in_cwd(tmp_path: Path) -> None:
    write(tmp_path, "kvmeta:\n  grpc_port: 4002\n", "tideserve.yaml")
    assert load_settings(KVMetaSettings, "kvmeta").grpc_port == 4002


def test_state_dir_expands_home(tmp_path: Path) -> None:
    settings = load_settings(KVMetaSettings, "kvmeta", None, {"state_dir": "~/ts"})
    assert settings.state_dir == Path.home() / "ts"


def test_empty_url_means_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIDESERVE_POSTGRES_URL", "")
    assert load_settings(KVMetaSettings, "kvmeta").postgres_url is None


# Each case: yaml text (or None), env, overrides → the start of the one-line error.
MALFORMED = [
    (None, {}, {"grpc_port": "abc"}, "invalid setting kvmeta.grpc_port (from command line): "),
    ("grpc_port: 70000\n", {}, {}, "invalid setting kvmeta.grpc_port (from "),
    (None, {"TIDESERVE_GRPC_PORT": "x"}, {}, "invalid setting kvmeta.grpc_port (from env "),
    (None, {"TIDESERVE_KVMETA__LOG_LEVEL": "LOUD"}, {}, "invalid setting kvmeta.log_level"),
    (None, {}, {"log_format": "xml"}, "invalid setting kvmeta.log_format"),
    (None, {}, {"shutdown_grace_s": "-1"}, "invalid setting kvmeta.shutdown_grace_s"),
    ("kvmeta:\n  grpc_prot: 1\n", {}, {}, "invalid setting kvmeta.grpc_prot: unknown setting"),
    ("kvmeta: 5\n", {}, {}, "invalid setting kvmeta: section"),
    ("grpc_port: [1\n", {}, {}, "invalid setting config: "),
    ("- a\n- b\n", {}, {}, "invalid setting config: "),
    (None, {}, {"no_such": 1}, "invalid setting kvmeta.no_such: unknown setting"),
]


@pytest.mark.parametrize(
    ("yaml_text", "env", "overrides", "prefix"),
    MALFORMED,
    ids=[
        "override-not-int",
        "file-port-out-of-range",
        "env-not-int",
        "env-bad-level",
        "bad-format",
        "negative-grace",
        "unknown-key-in-section",
        "section-not-mapping",
        "yaml-syntax",
        "yaml-not-mapping",
        "unknown-override",
    ],
)
def test_malformed_settings_one_line(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    yaml_text: str | None,
    env: dict[str, str],
    overrides: dict[str, Any],
    prefix: str,
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    config = write(tmp_path, yaml_text) if yaml_text is not None else None
    with pytest.raises(SettingsError) as info:
        load_settings(KVMetaSettings, "kvmeta", config, overrides)
    message = str(info.value)
    assert message.startswith(prefix), message
    assert "\n" not in message


def test_not_an_integer_message() -> None:
    with pytest.raises(SettingsError) as info:
        load_settings(KVMetaSettings, "kvmeta", None, {"grpc_port": "abc"})
    assert "Input should be a valid integer" in str(info.value)
    assert "'abc'" in str(info.value)


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match=r"^invalid setting config: cannot read .*nope\.yaml"):
        load_settings(KVMetaSettings, "kvmeta", tmp_path / "nope.yaml", {})


def test_cli_flags_become_overrides() -> None:
    parser = argparse.ArgumentParser()
    add_common_arguments(parser)
    args = parser.parse_args(["--grpc-port", "7001", "--redis-url", "redis://h:1/0"])
    overrides = overrides_from_args(args)
    assert overrides == {"grpc_port": "7001", "redis_url": "redis://h:1/0"}
    settings = load_settings(KVMetaSettings, "kvmeta", args.config, overrides)
    assert (settings.grpc_port, settings.redis_url) == (7001, "redis://h:1/0")


@pytest.mark.parametrize(
    ("overrides", "error"),
    [
        ({}, None),
        ({"trace_exporter": "console"}, None),
        ({"trace_exporter": "otlp"}, "invalid setting kvmeta.otlp_endpoint: required"),
    ],
    ids=["none", "console", "otlp-without-endpoint"],
)
def test_trace_exporter_settings(overrides: dict[str, Any], error: str | None) -> None:
    from services.common.otel import configure_tracing

    settings = load_settings(KVMetaSettings, "kvmeta", None, overrides)
    if error is None:
        provider = configure_tracing(settings, "kvmeta")
        assert provider.resource.attributes["service.name"] == "tideserve-kvmeta"
        provider.shutdown()
    else:
        with pytest.raises(SettingsError, match=error):
            configure_tracing(settings, "kvmeta")
