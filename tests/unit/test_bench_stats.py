"""Benchmark statistics, SSE accounting and the CPU saturation rule (pure, table-driven)."""

from __future__ import annotations

import io

import pytest

from services.bench.client import (
    BenchConfig,
    BenchError,
    Progress,
    arrival_offsets,
    build_body,
)
from services.bench.cpu import assess_cpu
from services.bench.sse import StreamError, StreamState
from services.common.bench.plot import cdf_points
from services.common.bench.stats import (
    RequestResult,
    distribution,
    infinite_cache_hit_ratio,
    markdown_table,
    percentile,
    request_records,
    summarize,
)
from services.common.bench.traces import TraceRequest

STABLE_KEYS = {
    "completed",
    "failed",
    "duration_s",
    "request_throughput_rps",
    "output_token_throughput",
    "ttft_ms",
    "tpot_ms",
    "e2e_ms",
    "cache_hit_ratio",
    "goodput_rps",
    "slo_attainment",
}


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [
        ([5.0], 0.99, 5.0),
        ([1.0, 2.0, 3.0, 4.0], 0.5, 2.5),
        ([1.0, 2.0, 3.0, 4.0], 0.0, 1.0),
        ([1.0, 2.0, 3.0, 4.0], 1.0, 4.0),
        ([float(i) for i in range(1, 101)], 0.9, 90.1),
        ([float(i) for i in range(1, 101)], 0.99, 99.01),
    ],
    ids=["single", "median-interpolated", "min", "max", "p90-of-100", "p99-of-100"],
)
def test_percentile_interpolates_linearly(values: list[float], q: float, expected: float) -> None:
    assert percentile(values, q) == pytest.approx(expected)


def test_distribution_of_nothing_is_all_none() -> None:
    assert distribution([]) == {"mean": None, "p50": None, "p90": None, "p99": None}
    assert distribution([3.0, 1.0, 2.0]) == {"mean": 2.0, "p50": 2.0, "p90": 2.8, "p99": 2.98}


def _res(
    i: int,
    *,
    ttft: float | None = 0.1,
    tpot: float | None = 0.01,
    e2e: float = 1.0,
    out: int = 10,
    prompt: int | None = 100,
    cached: int | None = 0,
    error: str | None = None,
) -> RequestResult:
    return RequestResult(
        index=i,
        target="http://t",
        scheduled_s=float(i),
        sent_s=float(i),
        input_length=100,
        output_length=out,
        error=error,
        ttft_s=ttft,
        tpot_s=tpot,
        e2e_s=e2e,
        output_tokens=out,
        prompt_tokens=prompt,
        cached_tokens=cached,
    )


@pytest.mark.parametrize(
    ("results", "slo_ttft", "slo_tpot", "scale", "completed", "failed", "good", "attain", "hit"),
    [
        ([_res(0), _res(1), _res(2)], None, None, 1.0, 3, 0, 3, 1.0, 0.0),
        ([_res(0, ttft=0.5), _res(1, ttft=0.05)], 200.0, None, 1.0, 2, 0, 1, 0.5, 0.0),
        ([_res(0, tpot=0.05), _res(1, tpot=None)], 100.0, 20.0, 1.0, 2, 0, 1, 0.5, 0.0),
        (
            [_res(0), _res(1, error="http 500: boom", ttft=None, tpot=None, prompt=None)],
            None,
            None,
            1.0,
            1,
            1,
            1,
            0.5,
            0.0,
        ),
        ([_res(0, cached=50), _res(1, cached=25, prompt=50)], None, None, 1.0, 2, 0, 2, 1.0, 0.5),
        # Trace time x10: a 0.1 s wall TTFT is 1000 ms, missing a 500 ms SLO.
        ([_res(0)], 500.0, None, 10.0, 1, 0, 0, 0.0, 0.0),
    ],
    ids=[
        "no-slo-all-good",
        "ttft-slo-splits",
        "tpot-slo-and-single-token",
        "failure-counts-against-attainment",
        "cache-hit-ratio-weighted-by-tokens",
        "trace-time-scales-slos",
    ],
)
def test_summarize_counts_goodput_and_cache_hits(
    results: list[RequestResult],
    slo_ttft: float | None,
    slo_tpot: float | None,
    scale: float,
    completed: int,
    failed: int,
    good: int,
    attain: float,
    hit: float,
) -> None:
    s = summarize(
        results, duration_s=2.0, slo_ttft_ms=slo_ttft, slo_tpot_ms=slo_tpot, time_scale=scale
    )
    assert STABLE_KEYS <= s.keys()
    assert (s["completed"], s["failed"]) == (completed, failed)
    assert s["goodput_rps"] == pytest.approx(good / (2.0 * scale))
    assert s["slo_attainment"] == pytest.approx(attain)
    assert s["cache_hit_ratio"] == pytest.approx(hit)
    assert s["request_throughput_rps"] == pytest.approx(completed / (2.0 * scale))
    assert s["ttft_ms"]["p50"] is not None


def test_summarize_reports_errors_and_latencies_in_ms() -> None:
    rs = [_res(0, ttft=0.2, e2e=2.0), _res(1, error="timeout after 5s", ttft=None, tpot=None)]
    s = summarize(rs, duration_s=4.0)
    assert s["errors"] == {"timeout after 5s": 1}
    assert s["ttft_ms"]["mean"] == pytest.approx(200.0)
    assert s["e2e_ms"]["p99"] == pytest.approx(2000.0)
    assert s["output_token_throughput"] == pytest.approx(10 / 4.0)
    assert "| TTFT | 200 |" in markdown_table(s)


@pytest.mark.parametrize(
    ("results", "slo_ttft", "scale", "expected"),
    [
        ([_res(1), _res(0, ttft=0.5)], 200.0, 1.0, [(0, 500.0, False), (1, 100.0, True)]),
        ([_res(0)], 500.0, 10.0, [(0, 1000.0, False)]),
        (
            [_res(0, error="http 500: boom", ttft=None, tpot=None, prompt=None)],
            None,
            1.0,
            [(0, None, False)],
        ),
    ],
    ids=["index-order-and-ttft-slo", "trace-time-scales", "failed-never-meets"],
)
def test_request_records_agree_with_the_summary(
    results: list[RequestResult],
    slo_ttft: float | None,
    scale: float,
    expected: list[tuple[int, float | None, bool]],
) -> None:
    recs = request_records(results, slo_ttft_ms=slo_ttft, time_scale=scale)
    assert [(r["index"], r["ttft_ms"], r["met_slo"]) for r in recs] == [
        (i, pytest.approx(t) if t is not None else None, met) for i, t, met in expected
    ]
    s = summarize(results, duration_s=1.0, slo_ttft_ms=slo_ttft, time_scale=scale)
    assert sum(r["met_slo"] for r in recs) == s["slo"]["met"]


def _tr(i: int, n_in: int, ids: tuple[int, ...] | None) -> TraceRequest:
    return TraceRequest(
        index=i, line=i + 1, arrival_s=float(i), input_length=n_in, output_length=1, hash_ids=ids
    )


@pytest.mark.parametrize(
    ("reqs", "expected"),
    [
        ([_tr(0, 1024, (1, 2)), _tr(1, 1024, (1, 2))], 0.5),
        ([_tr(0, 1024, (1, 2)), _tr(1, 1024, (3, 2))], 0.0),
        ([_tr(0, 1024, (1, 2)), _tr(1, 1100, (1, 2, 3))], 1024 / 2124),
        ([_tr(0, 512, (1,)), _tr(1, 300, (1,))], 300 / 812),
        ([_tr(0, 100, None), _tr(1, 100, None)], 0.0),
    ],
    ids=["repeat", "first-block-differs", "extension", "partial-tail-hit", "no-hash-ids"],
)
def test_infinite_cache_hit_ratio(reqs: list[TraceRequest], expected: float) -> None:
    assert infinite_cache_hit_ratio(reqs, 512) == pytest.approx(expected, abs=1e-6)


def _chat(text: str) -> str:
    return 'data: {"choices":[{"index":0,"delta":{"content":"' + text + '"}}]}'


USAGE = (
    'data: {"choices":[],"usage":{"prompt_tokens":100,"completion_tokens":5,'
    '"prompt_tokens_details":{"cached_tokens":64}}}'
)


@pytest.mark.parametrize(
    ("lines", "error", "tokens", "ttft", "tpot", "cached"),
    [
        (
            [_chat(""), _chat("a"), _chat("b"), _chat("c d e"), USAGE, "data: [DONE]"],
            None,
            5,
            1.0,
            (3.0 - 1.0) / 4,
            64,
        ),
        ([": ping", _chat("a"), "", _chat("b"), "data: [DONE]"], None, 2, 1.0, 2.0, None),
        (
            ['data: {"choices":[{"index":0,"text":"x"}]}', "data: [DONE]"],
            None,
            1,
            0.0,
            None,
            None,
        ),
        ([_chat("a"), _chat("b")], "stream ended without [DONE]", 2, 0.0, 1.0, None),
        (["data: [DONE]"], "stream finished without any token", 0, None, None, None),
        ([_chat("a"), "data: {oops"], "malformed SSE data", 1, None, None, None),
        (
            [_chat("a"), 'data: {"error":{"message":"engine died"}}'],
            "error in stream: engine died",
            1,
            None,
            None,
            None,
        ),
    ],
    ids=[
        "coalesced-chunks-use-usage",
        "count-chunks-without-usage",
        "completions-text",
        "missing-done",
        "no-tokens",
        "malformed-json",
        "error-event",
    ],
)
def test_stream_state_measures_or_names_the_failure(
    lines: list[str],
    error: str | None,
    tokens: int,
    ttft: float | None,
    tpot: float | None,
    cached: int | None,
) -> None:
    state = StreamState(sent_at=10.0)
    err: str | None = None
    for i, line in enumerate(lines):
        try:
            state.feed_line(line, 10.0 + i)
        except StreamError as exc:  # the client ends the stream here
            err = str(exc)
            break
    out = state.finish(100.0, err)
    if error is None:
        assert out.error is None
        assert out.ttft_s == pytest.approx(ttft)
        assert out.tpot_s == (None if tpot is None else pytest.approx(tpot))
        assert out.cached_tokens == cached
    else:
        assert out.error is not None and out.error.startswith(error)
    assert out.output_tokens == tokens
    assert out.e2e_s == pytest.approx(90.0)


@pytest.mark.parametrize(
    ("samples", "interval", "saturated"),
    [
        ([], 1.0, False),
        ([[50.0, 60.0]] * 20, 1.0, False),
        ([[95.0, 92.0]] * 20, 1.0, True),
        ([[20.0, 20.0]] * 10 + [[100.0, 99.0]] * 5 + [[20.0, 20.0]] * 10, 1.0, True),
        ([[20.0, 20.0]] * 10 + [[100.0, 99.0]] * 4 + [[20.0, 20.0]] * 10, 1.0, False),
        ([[100.0, 0.0]] * 20, 1.0, False),
    ],
    ids=[
        "no-samples",
        "half-busy",
        "mean-over-threshold",
        "sustained-5s-burst",
        "short-burst",
        "one-core-pinned-is-not-machine-saturation",
    ],
)
def test_cpu_saturation_rule(samples: list[list[float]], interval: float, saturated: bool) -> None:
    out = assess_cpu(samples, interval)
    assert out["saturated"] is saturated
    assert out["samples"] == len(samples)


@pytest.mark.parametrize(
    ("arrivals", "speedup", "rate_scale", "expected"),
    [
        ([0.0, 1.0, 3.0], 1.0, 1.0, [0.0, 1.0, 3.0]),
        ([0.0, 1.0, 3.0], 2.0, 1.0, [0.0, 0.5, 1.5]),
        ([0.0, 1.0, 3.0], 2.0, 3.0, [0.0, 1 / 6, 0.5]),
    ],
    ids=["real-time", "speedup", "speedup-and-rate-scale"],
)
def test_arrival_offsets(
    arrivals: list[float], speedup: float, rate_scale: float, expected: list[float]
) -> None:
    reqs = [
        TraceRequest(index=i, line=i, arrival_s=t, input_length=1, output_length=1)
        for i, t in enumerate(arrivals)
    ]
    assert arrival_offsets(reqs, speedup, rate_scale) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("api", "output_length", "max_tokens"),
    [("chat", 7, 7), ("completions", 7, 7), ("chat", 0, 1)],
    ids=["chat", "completions", "zero-output-asks-one"],
)
def test_body_forces_the_trace_output_length(api: str, output_length: int, max_tokens: int) -> None:
    req = TraceRequest(index=0, line=1, arrival_s=0, input_length=2, output_length=output_length)
    body = build_body(req, "a b", "m", "chat" if api == "chat" else "completions")
    assert body["max_tokens"] == body["min_tokens"] == max_tokens
    assert body["ignore_eos"] is True and body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert ("messages" in body) == (api == "chat") and ("prompt" in body) == (api != "chat")


@pytest.mark.parametrize(
    "kwargs",
    [{"targets": ()}, {"speedup": 0.0}, {"max_requests": 0}, {"duration_s": -1.0}],
    ids=["no-target", "zero-speedup", "zero-max-requests", "negative-duration"],
)
def test_bench_config_rejects_bad_values(kwargs: dict[str, object]) -> None:
    args: dict[str, object] = {"targets": ("http://x",), **kwargs}
    with pytest.raises(BenchError):
        BenchConfig(**args)  # type: ignore[arg-type]


def test_cdf_points() -> None:
    assert cdf_points([3.0, 1.0]) == ([1.0, 3.0], [0.5, 1.0])
    assert cdf_points([]) == ([], [])


class _Tty(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


@pytest.mark.parametrize(("tty", "drawn"), [(True, True), (False, False)], ids=["tty", "pipe"])
def test_progress_bar_is_drawn_only_on_a_terminal(tty: bool, drawn: bool) -> None:
    stream = _Tty(tty)
    bar = Progress(4, stream)
    bar.done, bar.failed, bar.inflight = 2, 1, 1
    bar.update(3.0)
    bar.close(4.0)
    text = stream.getvalue()
    assert ("2/4 failed 1 in-flight 1" in text) is drawn
    assert (text.count("#") == 30) is drawn  # half of the 30-column bar, twice
