"""One composition root: `tideserve gateway` flags become the scheduler's settings, and the
service and the CLI build the same gateway from them."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from services.common.admission.shaper_config import DISPATCH_PROTECT_WHEN_MISSED
from services.common.errors import StartupError
from services.scheduler import cli
from services.scheduler.compose import Scheduler, endpoint_specs
from services.scheduler.settings import SchedulerSettings


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers())
    return parser.parse_args(["gateway", *argv])


def test_cli_engines_become_endpoint_entries_with_bootstrap_ports() -> None:
    s = cli.settings_from_args(
        _args(
            "--prefill",
            "http://127.0.0.1:30001",
            "8998",
            "--prefill",
            "http://127.0.0.1:30003",
            "--decode",
            "http://127.0.0.1:30002",
            "--deployment",
            "dep",
        )
    )
    specs = {e.instance_id: e for e in endpoint_specs(s)}
    assert specs["127.0.0.1:30001"].role == "prefill"
    assert specs["127.0.0.1:30001"].bootstrap_port == 8998
    assert specs["127.0.0.1:30001"].url == "http://127.0.0.1:30001"
    assert specs["127.0.0.1:30003"].bootstrap_port == 0
    assert specs["127.0.0.1:30002"].role == "decode"
    assert {e.deployment for e in specs.values()} == {"dep"}


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        ((), False),
        (("--pd-protocol", "vllm"), True),
        (("--decode-can-prefill",), True),
        (("--pd-protocol", "vllm", "--no-decode-can-prefill"), False),
    ],
)
def test_decode_can_prefill_has_one_default(argv: tuple[str, ...], expected: bool) -> None:
    s = cli.settings_from_args(_args("--endpoints", "http://a:1", *argv))
    assert s.decode_computes_prompts() is expected
    assert Scheduler(s).core.scheduler.decode_can_prefill is expected


def test_cli_flags_reach_the_gateway() -> None:
    s = cli.settings_from_args(
        _args(
            "--endpoints",
            "http://a:1",
            "--profile",
            "least_load",
            "--model",
            "m",
            "--retries",
            "4",
            "--no-preemption",
            "--max-in-flight",
            "7",
        )
    )
    gw = Scheduler(s).gateway
    assert gw.opts.profile == "least_load"
    assert gw.opts.models == ("m",)
    assert gw.opts.retries == 4
    assert gw.opts.preemption is False
    assert gw.core.limits.max_in_flight_per_endpoint == 7


def test_unknown_profile_and_duplicates_are_refused() -> None:
    with pytest.raises(StartupError, match="unknown profile 'nope'"):
        Scheduler(SchedulerSettings(endpoints=["http://a:1"], profile="nope"))
    with pytest.raises(ValueError, match="listed twice"):
        cli.settings_from_args(_args("--endpoints", "http://a:1", "worker=http://a:1"))
    with pytest.raises(ValueError, match="bootstrap port"):
        SchedulerSettings(endpoints=["prefill=http://a:1#bootstrap=x"])


def test_http_and_grpc_share_one_admission_gate() -> None:
    s = Scheduler(SchedulerSettings(endpoints=["http://a:1"]))
    assert s.servicer.gate is s.gateway.gate


def test_engine_authorization_flags_reach_the_gateway() -> None:
    s = cli.settings_from_args(
        _args(
            "--endpoints", "http://a:1", "--forward-authorization", "--engine-api-key", "sekrit-42"
        )
    )
    assert "sekrit-42" not in repr(s)  # a secret: not in logs
    gw = Scheduler(s).gateway
    assert gw.opts.forward_authorization is True and gw.opts.engine_api_key == "sekrit-42"
    assert gw.forwarder.authorization == "Bearer sekrit-42"


def test_one_tracer_provider_and_tool_contents_from_settings() -> None:
    from services.scheduler.main import build

    s = SchedulerSettings(
        endpoints=["http://a:1"], trace_exporter="console", record_tool_contents=True
    )
    sch = Scheduler(s)
    assert sch.gateway.tracer_provider is sch.tracer_provider
    assert sch.gateway.opts.record_tool_contents
    hooks = build(s)  # the gRPC server gets the provider the gateway traces with
    assert hooks.tracer_provider is not None
    assert hooks.tracer_provider.resource.attributes["service.name"] == "tideserve-scheduler"


def test_bad_otlp_settings_stop_the_scheduler() -> None:
    from services.common.errors import SettingsError

    s = SchedulerSettings(endpoints=["http://a:1"], trace_exporter="otlp")
    with pytest.raises(SettingsError, match=r"scheduler\.otlp_endpoint: required"):
        Scheduler(s)


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ([], ("none", None, 1.0, False)),
        (
            [
                *("--trace-exporter", "otlp", "--otlp-endpoint", "https://c:4317"),
                *("--trace-sample-ratio", "0.1", "--record-tool-contents"),
            ],
            ("otlp", "https://c:4317", 0.1, True),
        ),
    ],
    ids=["defaults", "otlp"],
)
def test_cli_tracing_and_tool_flags(flags: list[str], expected: tuple[object, ...]) -> None:
    s = cli.settings_from_args(_args("--endpoints", "http://a:1", *flags))
    got = (s.trace_exporter, s.otlp_endpoint, s.trace_sample_ratio, s.record_tool_contents)
    assert got == expected


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ([], ([], 30 * 86400.0)),
        (
            ["--native-apis", "messages", "responses", "--responses-retention", "3600"],
            (["messages", "responses"], 3600.0),
        ),
    ],
    ids=["defaults", "native-and-retention"],
)
def test_cli_agent_api_flags(flags: list[str], expected: tuple[object, ...]) -> None:
    s = cli.settings_from_args(_args("--endpoints", "http://a:1", *flags))
    assert (s.native_apis, s.responses_retention_s) == expected


@pytest.mark.parametrize(
    ("extra", "error"),
    [
        ({}, "api_keys: needs postgres_url"),
        (
            {"postgres_url": "postgresql://u@h/db", "forward_authorization": True},
            "forward_authorization",
        ),
    ],
    ids=["no-database", "would-forward-client-keys"],
)
def test_api_keys_refuse_settings_that_cannot_work(extra: dict[str, object], error: str) -> None:
    with pytest.raises(StartupError, match=error):
        Scheduler(SchedulerSettings(api_keys=True, **extra))  # type: ignore[arg-type]


def test_api_keys_from_the_cli_flags_build_a_gate_without_io() -> None:
    s = cli.settings_from_args(
        _args(
            "--endpoints",
            "http://127.0.0.1:30001",
            "--api-keys",
            "--postgres-url",
            "postgresql://u@127.0.0.1:1/db",
        )
    )
    assert s.api_keys and s.postgres_url == "postgresql://u@127.0.0.1:1/db"
    gw = Scheduler(s).gateway
    assert gw.keys is not None and gw.keys.default_class == s.default_slo_class
    assert gw.keys.classes == ("interactive", "agent", "batch")  # highest priority first
    assert Scheduler(SchedulerSettings()).gateway.keys is None  # off by default


@pytest.mark.parametrize(
    ("text", "flags", "expect_default", "expect_ttft"),
    [
        (
            "scheduler:\n  http_port: 0\n  slo_classes:\n"
            "    - {name: gold, priority: 9, ttft_ms: 1500, tpot_ms: 80}\n"
            "  default_slo_class: gold\n",
            (),
            "gold",
            {"gold": 1500.0},
        ),
        (
            "slo_classes:\n  - {name: gold, priority: 9, ttft_ms: 1500}\n"
            "  - {name: agent, priority: 1, ttft_ms: 9000}\n",
            (),
            "agent",
            {"gold": 1500.0, "agent": 9000.0},
        ),
        (
            "slo_classes:\n  - {name: gold, priority: 9, ttft_ms: 1500}\n"
            "  - {name: agent, priority: 1}\n",
            ("--default-slo-class", "gold"),
            "gold",
            {"gold": 1500.0, "agent": 0.0},
        ),
    ],
    ids=["tideserve-yaml-section", "top-level-keys", "flag-overrides-file-default"],
)
def test_slo_config_file_reaches_the_gateway(
    tmp_path: Path,
    text: str,
    flags: tuple[str, ...],
    expect_default: str,
    expect_ttft: dict[str, float],
) -> None:
    f = tmp_path / "slo.yaml"
    f.write_text(text)
    s = cli.settings_from_args(_args("--endpoints", "http://a:1", "--slo-config", str(f), *flags))
    core = Scheduler(s).core
    assert core.queue.config.default_class == expect_default
    assert dict(core.slo.ttft_ms) == expect_ttft


@pytest.mark.parametrize(
    ("text", "error"),
    [("- just a list\n", "expected a mapping"), ("slo_classes: [{name: x}]\n", "slo_classes")],
    ids=["not-a-mapping", "class-without-priority"],
)
def test_bad_slo_config_file_is_one_line(tmp_path: Path, text: str, error: str) -> None:
    f = tmp_path / "slo.yaml"
    f.write_text(text)
    with pytest.raises(ValueError, match=error):
        cli.settings_from_args(_args("--endpoints", "http://a:1", "--slo-config", str(f)))


@pytest.mark.parametrize(
    ("argv", "protect", "slack", "when_missed"),
    [((), False, False, 0.0),
     (("--dispatch-protect", "off"), False, False, 0.0),
     (("--dispatch-protect", "guard"), True, False, 0.0),
     (("--dispatch-protect", "slack"), True, True, 0.0),
     (("--dispatch-protect", "auto"), True, False, DISPATCH_PROTECT_WHEN_MISSED),
     (("--dispatch-protect", "auto", "--dispatch-protect-when-missed", "0.9"), True, False,
      0.9)],
    ids=["default", "off", "guard", "slack", "auto", "auto-0.9"],
)  # fmt: skip
def test_dispatch_protect_reaches_the_dispatch_order(
    argv: tuple[str, ...], protect: bool, slack: bool, when_missed: float
) -> None:
    s = cli.settings_from_args(_args("--endpoints", "http://a:1", *argv))
    config = Scheduler(s).gateway.dispatch.shaper.config
    assert (config.protect, config.protect_slack) == (protect, slack)
    assert config.protect_when_missed == when_missed
