"""``tideserve sim --rate-curve FILE --lengths TRACE``: reading a rate curve, the arrivals it
makes (counts, clock, seed, cap) and the requests they carry, and the CLI around it.
Virtual time: no timing assertions."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from services.common.bench.traces import Trace, TraceError, parse_mooncake
from services.sim.cli import main as sim_main
from services.sim.curve import RateCurve, arrival_times, curve_trace, read_curve


def lines(n: int) -> list[str]:
    """Requests i with a prefix of two blocks shared by pairs, one block of their own."""
    return [
        json.dumps({"timestamp": i * 100, "input_length": 1100, "output_length": 10 + i,
                    "hash_ids": [i // 2 * 10, i // 2 * 10 + 1, 1000 + i]})
        for i in range(n)
    ]  # fmt: skip


def lengths_trace(n: int) -> Trace:
    return Trace("l.jsonl", "mooncake", tuple(parse_mooncake(lines(n))))


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


CURVE = RateCurve("c.csv", (0.0, 600.0, 1200.0), (10.0, 30.0, 20.0))


# -- reading ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("t,rate\n0,1\n", "header is 't_s,rate_rps'"),
        ("", "header is 't_s,rate_rps'"),
        ("t_s,rate_rps\n", "no rows"),
        ("t_s,rate_rps\n0,1\n0,2\n", ":3: t_s must increase"),
        ("t_s,rate_rps\n0,1\n60,x\n", ":3: expected two numbers"),
        ("t_s,rate_rps\n0,-1\n", ":2: t_s and rate_rps must be finite, rate_rps >= 0"),
        ("t_s,rate_rps\n0,nan\n", ":2: t_s and rate_rps must be finite"),
        ("t_s,rate_rps\n5,1\n", "the first row's t_s must be 0"),
        ("t_s,rate_rps\n0,0\n60,0\n", "every rate is 0"),
    ],
    ids=["bad-header", "empty", "no-rows", "not-increasing", "not-a-number", "negative",
         "nan", "late-start", "all-zero"],
)  # fmt: skip
def test_a_bad_curve_is_refused_with_file_and_line(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(TraceError, match=message):
        read_curve(write(tmp_path / "c.csv", text))


def test_a_curve_reads_rows_and_spans_one_row_past_the_last(tmp_path: Path) -> None:
    c = read_curve(write(tmp_path / "c.csv", "t_s,rate_rps\n0,10\n600,30\n1200,20\n\n"))
    assert (c.t_s, c.rate_rps, c.span_s) == ((0.0, 600.0, 1200.0), (10.0, 30.0, 20.0), 1800.0)
    assert c.rates_at(np.array([0.0, 300.0, 1500.0])).tolist() == [10.0, 20.0, 20.0]


# -- arrivals -----------------------------------------------------------------------------
def expected_count(curve: RateCurve, rate_scale: float) -> float:
    """The curve's integral: trapezoids between rows, the last rate held one row step."""
    t, r = curve.t_s, curve.rate_rps
    area = sum((t[i + 1] - t[i]) * (r[i] + r[i + 1]) / 2 for i in range(len(t) - 1))
    return (area + (curve.span_s - t[-1]) * r[-1]) * rate_scale


@pytest.mark.parametrize(
    ("rate_scale", "speedup"),
    [(1.0, 1.0), (0.1, 1.0), (1.0, 60.0), (2.0, 600.0)],
    ids=["as-is", "scaled-down", "compressed", "scaled-and-compressed"],
)
def test_arrivals_follow_the_curve_on_its_compressed_clock(
    rate_scale: float, speedup: float
) -> None:
    at = arrival_times(CURVE, rate_scale=rate_scale, speedup=speedup, seed=1, limit=None)
    # a curve states rates: compressing its clock leaves them, so the count falls with it
    mean = expected_count(CURVE, rate_scale) / speedup
    assert abs(len(at) - mean) <= 5 * math.sqrt(mean) + 1  # Poisson: within 5 sigma
    assert np.all(np.diff(at) >= 0) and at[0] >= 0 and at[-1] < CURVE.span_s / speedup
    # the busier half of the curve (600-1200 s rises to 30/s) brings more than the first
    half = CURVE.t_s[1] / speedup
    if mean > 100:
        assert np.sum(at >= half) > np.sum(at < half)


def test_the_same_seed_gives_the_same_arrivals_and_another_seed_others() -> None:
    a = arrival_times(CURVE, rate_scale=0.5, speedup=1.0, seed=3, limit=None)
    b = arrival_times(CURVE, rate_scale=0.5, speedup=1.0, seed=3, limit=None)
    c = arrival_times(CURVE, rate_scale=0.5, speedup=1.0, seed=4, limit=None)
    assert np.array_equal(a, b) and not np.array_equal(a, c)


def test_max_requests_keeps_the_earliest() -> None:
    every = arrival_times(CURVE, rate_scale=1.0, speedup=1.0, seed=0, limit=None)
    first = arrival_times(CURVE, rate_scale=1.0, speedup=1.0, seed=0, limit=100)
    assert np.array_equal(first, every[:100])


# -- the requests they carry --------------------------------------------------------------
def test_arrivals_carry_the_lengths_trace_in_order_and_repeat_with_fresh_ids() -> None:
    src = lengths_trace(10)
    t = curve_trace(CURVE, src, rate_scale=0.02, seed=0, offset=2)
    n = len(t.requests)
    assert n > 16  # the 8 requests after the offset repeat
    assert [r.output_length for r in t.requests[:8]] == [r.output_length for r in src.requests[2:]]
    assert t.requests[8].output_length == src.requests[2].output_length
    first_ids = {h for r in t.requests[:8] for h in r.hash_ids or ()}
    assert not first_ids & set(t.requests[8].hash_ids or ())  # a repeat shares no prefix
    a, b = t.requests[2].hash_ids or (), t.requests[3].hash_ids or ()
    assert a[:2] == b[:2] and a  # the trace's own reuse
    arrivals = [r.arrival_s for r in t.requests]
    assert arrivals == sorted(arrivals) and [r.index for r in t.requests] == list(range(n))


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [({"offset": 10}, "no requests after offset"), ({"rate_scale": 0.0}, "must be > 0"),
     ({"rate_scale": 1e-9}, "brings no request")],
    ids=["offset-past-end", "zero-scale", "no-arrival"],
)  # fmt: skip
def test_a_curve_trace_refuses_what_it_cannot_make(kwargs: dict[str, float], error: str) -> None:
    with pytest.raises((TraceError, ValueError), match=error):
        curve_trace(CURVE, lengths_trace(10), **kwargs)  # type: ignore[arg-type]


# -- the CLI ------------------------------------------------------------------------------
def cli_files(tmp_path: Path) -> tuple[Path, Path]:
    curve = write(tmp_path / "c.csv", "t_s,rate_rps\n0,2\n600,4\n1200,1\n")
    return curve, write(tmp_path / "l.jsonl", "\n".join(lines(12)) + "\n")


def test_the_cli_replays_a_rate_curve(tmp_path: Path) -> None:
    curve, lengths = cli_files(tmp_path)
    out = tmp_path / "o.json"
    argv = ["--rate-curve", str(curve), "--lengths", str(lengths), "--speedup", "20",
            "--engines", "2", "--kv-blocks", "2048", "--max-requests", "40", "--out", str(out)]  # fmt: skip
    assert sim_main(argv) == 0
    doc = json.loads(out.read_text(encoding="utf-8"))
    assert doc["completed"] == 40 and doc["trace"]["requests_replayed"] == 40
    assert doc["rate_curve"]["speedup"] == 20.0 and doc["rate_curve"]["rows"] == 3
    # the arrivals are already in modelled time: the replay divides them by nothing
    assert doc["config"]["speedup"] == 1.0 and doc["config"]["rate_scale"] == 1.0
    again = tmp_path / "again.json"
    assert sim_main([*argv[:-1], str(again)]) == 0
    same = json.loads(again.read_text(encoding="utf-8"))
    assert same["ttft_ms"] == doc["ttft_ms"] and same["trace"] == doc["trace"]


@pytest.mark.parametrize(
    ("which", "message"),
    [("curve-alone", "--rate-curve needs --lengths"), ("lengths-alone", "--lengths goes with"),
     ("both-sources", "not allowed with"), ("bad-curve", "header is 't_s,rate_rps'")],
    ids=["curve-alone", "lengths-alone", "both-sources", "bad-curve"],
)  # fmt: skip
def test_the_cli_refuses_a_bad_curve_setup_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], which: str, message: str
) -> None:
    curve, lengths = cli_files(tmp_path)
    argv = {
        "curve-alone": ["--rate-curve", str(curve)],
        "lengths-alone": ["--trace", str(lengths), "--lengths", str(lengths)],
        "both-sources": ["--trace", str(lengths), "--rate-curve", str(curve)],
        "bad-curve": ["--rate-curve", str(lengths), "--lengths", str(lengths)],
    }[which]
    out = tmp_path / "o.json"
    with pytest.raises(SystemExit) as exc:
        sim_main([*argv, "--out", str(out)])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1 and message in err, err
    assert not out.exists()


@pytest.mark.parametrize(
    ("span_s", "rows", "length_s"),
    [(600.0, (0.0,), 1.0), (601.0, (0.0, 600.0), 1200.0), (1e9, (0.0, 600.0, 1200.0), 1800.0)],
    ids=["first-row", "two-rows", "all"],
)
def test_head_keeps_the_rows_that_start_before_the_span(
    span_s: float, rows: tuple[float, ...], length_s: float
) -> None:
    head = CURVE.head(span_s)
    assert head.t_s == rows and head.rate_rps == CURVE.rate_rps[: len(rows)]
    assert head.span_s == length_s
