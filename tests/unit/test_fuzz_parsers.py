"""Property-based tests (hypothesis) of the pure parsers: whatever the input, each either
returns a well-typed value or raises its own documented error, never anything else.

Examples per test: the ``ci`` profile (tests/conftest.py) in ``make test``;
``HYPOTHESIS_PROFILE=long`` by hand for a deeper search."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from services.common.bench.traces import TraceError, parse_azure, parse_mooncake
from services.common.engine_load import parse_metrics
from services.common.errors import SettingsError
from services.common.routing.config import ConfigError, load_config
from services.common.settings import load_settings
from services.common.streams.ids import parse_id
from services.kvmeta.settings import KVMetaSettings
from services.scheduler.http.openai import ApiError, parse_request
from services.telemetry.model.scrape import parse_engine_page

METRIC_NAMES = [
    "sglang:num_running_reqs",
    "sglang:num_queue_reqs",
    "sglang:token_usage",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc",
]
VALUES = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["NaN", "+Inf", "-Inf", "1e400", "-0", "0x10", "1_000", ""]),
    st.text(max_size=8),
)
METRIC_LINE = st.builds(
    lambda name, labels, value: f"{name}{labels} {value}",
    st.sampled_from(METRIC_NAMES),
    st.sampled_from(["", '{engine="0"}', '{a="b",c="d"}', "{"]),
    VALUES,
)
PAGES = st.lists(st.one_of(METRIC_LINE, st.text(max_size=40)), max_size=12).map("\n".join)


@given(PAGES)
@example("vllm:num_requests_running NaN")
@example("sglang:num_running_reqs +Inf\nsglang:token_usage -Inf")
def test_gateway_metrics_parser_never_raises(text: str) -> None:
    report = parse_metrics(text)
    if report is not None:
        assert report.running >= 0 and report.waiting >= 0
        assert math.isfinite(report.kv_usage)


@given(PAGES)
@example("vllm:num_requests_running NaN")
def test_telemetry_scrape_parser_never_raises(text: str) -> None:
    parse_engine_page(text)


MOONCAKE_FIELDS = st.fixed_dictionaries(
    {},
    optional={
        "timestamp": st.one_of(st.integers(-10, 10**6), st.floats(), st.text(max_size=3)),
        "input_length": st.one_of(st.integers(-5, 10**5), st.floats(), st.none()),
        "output_length": st.one_of(st.integers(-5, 10**4), st.floats(), st.booleans()),
        "hash_ids": st.one_of(
            st.lists(st.one_of(st.integers(-(2**70), 2**70), st.text(max_size=2)), max_size=5),
            st.text(max_size=3),
        ),
    },
)
TRACE_LINE = st.one_of(MOONCAKE_FIELDS.map(json.dumps), st.text(max_size=30))


@given(st.lists(TRACE_LINE, max_size=6))
def test_mooncake_trace_parser_raises_only_trace_errors(lines: list[str]) -> None:
    try:
        reqs = parse_mooncake(lines)
    except TraceError:
        return
    for r in reqs:
        assert r.input_length >= 0 and r.output_length >= 0 and r.arrival_s >= 0


@given(
    st.lists(
        st.lists(st.one_of(st.text(max_size=12), st.integers().map(str)), max_size=4).map(",".join),
        max_size=5,
    )
)
@example(["TIMESTAMP,ContextTokens,GeneratedTokens", "2023-11-16 18:15:46.6805900,12,3"])
def test_azure_trace_parser_raises_only_trace_errors(lines: list[str]) -> None:
    header = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for rows in (lines, header + lines):
        try:
            parse_azure(rows)
        except TraceError:
            pass


@given(st.text(max_size=40))
def test_stream_ids_parse_or_raise_value_error(text: str) -> None:
    try:
        ms, seq = parse_id(text)
    except ValueError:
        return
    assert ms >= 0 and seq >= 0


YAML_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=10))
YAML_DOCS = st.recursive(
    YAML_SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(
            st.sampled_from(
                ["plugins", "profiles", "default_profile", "type", "name", "weight",
                 "parameters", "filters", "scorers", "picker", "default", "x"]
            ),
            inner,
            max_size=4,
        ),
    ),
    max_leaves=12,
)  # fmt: skip


@given(st.one_of(YAML_DOCS, st.text(max_size=60)))
def test_routing_config_raises_only_config_errors(doc: object) -> None:
    try:
        load_config(doc if isinstance(doc, str) else json.dumps(doc))
    except ConfigError:
        pass


SETTING_KEYS = st.sampled_from(
    ["grpc_port", "metrics_port", "redis_url", "log_level", "redis_client", "kvmeta",
     "stream_max_attempts", "tenant_quotas", "checkpoint_interval_s", "host", "state_dir"]
)  # fmt: skip


@given(st.one_of(st.dictionaries(SETTING_KEYS, YAML_DOCS, max_size=4).map(json.dumps),
                 st.text(max_size=60)))  # fmt: skip
def test_settings_raise_only_settings_errors(
    tmp_path_factory: pytest.TempPathFactory, text: str
) -> None:
    path = Path(tmp_path_factory.mktemp("cfg")) / "tideserve.yaml"
    path.write_text(text)
    try:
        load_settings(KVMetaSettings, "kvmeta", config_path=path)
    except SettingsError:
        pass


JSON_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=8)),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)),
    max_leaves=10,
)  # fmt: skip
BODY_KEYS = st.sampled_from(
    ["model", "prompt", "messages", "max_tokens", "stream", "stream_options", "temperature",
     "slo_class", "tenant", "session_id", "cache_salt", "n", "tools", "input_ids", "text",
     "max_completion_tokens", "role", "content"]
)  # fmt: skip
BODIES = st.one_of(
    st.dictionaries(BODY_KEYS, JSON_VALUES, max_size=6).map(lambda d: json.dumps(d).encode()),
    st.binary(max_size=40),
)
HEADERS = st.dictionaries(
    st.sampled_from(
        ["X-Tideserve-Class", "X-Tideserve-Tenant", "X-Tideserve-Session",
         "X-Tideserve-Deadline-Ms", "X-Tideserve-Profile", "traceparent"]
    ),
    st.text(max_size=12),
    max_size=3,
)  # fmt: skip


@given(st.sampled_from(["chat", "completion", "generate"]), BODIES, HEADERS)
@example("chat", b'{"model": "m", "messages": [{"role": "user", "content": "a\\u0000b"}]}', {})
@example("completion", b'{"model": "m", "prompt": "x", "max_tokens": 1e400}', {})
def test_gateway_request_parser_raises_only_api_errors_with_4xx(
    kind: str, raw: bytes, headers: dict[str, str]
) -> None:
    try:
        parse_request(kind, raw, headers, models=(), classes=("interactive", "agent", "batch"))  # type: ignore[arg-type]
    except ApiError as exc:
        assert 400 <= exc.status < 500, exc.body()
