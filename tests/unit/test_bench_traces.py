"""Trace readers: real slices parse; a bad line is named by file and line number."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from services.common.bench.traces import TraceError, load_trace, parse_azure, parse_mooncake

DATA = Path(__file__).resolve().parents[1] / "data"
MOONCAKE = DATA / "mooncake_conversation_head.jsonl"
AZURE = DATA / "azure_conv_head.csv"


def _line(**kw: object) -> str:
    base: dict[str, object] = {
        "timestamp": 0,
        "input_length": 600,
        "output_length": 5,
        "hash_ids": [1, 2],
    }
    base.update(kw)
    return json.dumps(base)


def test_mooncake_slice_parses_in_order_with_prefix_blocks() -> None:
    trace = load_trace(MOONCAKE)
    assert trace.format == "mooncake"
    assert len(trace.requests) == 200
    first = trace.requests[0]
    assert (first.arrival_s, first.input_length, first.output_length) == (0.0, 6758, 500)
    assert first.hash_ids is not None and first.hash_ids[:3] == (0, 1, 2)
    assert [r.index for r in trace.requests] == list(range(200))
    arrivals = [r.arrival_s for r in trace.requests]
    assert arrivals == sorted(arrivals)


def test_azure_slice_parses_relative_times() -> None:
    trace = load_trace(AZURE)
    assert trace.format == "azure"
    assert len(trace.requests) == 200
    r0, r1 = trace.requests[0], trace.requests[1]
    assert (r0.arrival_s, r0.input_length, r0.output_length, r0.hash_ids) == (0.0, 374, 44, None)
    # 18:15:50.9951690 - 18:15:46.6805900
    assert r1.arrival_s == pytest.approx(4.314579, abs=1e-5)
    assert r1.line == 3


def test_mooncake_out_of_order_lines_are_sorted_stably() -> None:
    lines = [_line(timestamp=2000), _line(timestamp=1000), _line(timestamp=1000, output_length=7)]
    reqs = parse_mooncake(lines, "t.jsonl")
    assert [(r.line, r.arrival_s) for r in reqs] == [(2, 0.0), (3, 0.0), (1, 1.0)]
    assert [r.index for r in reqs] == [0, 1, 2]


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "expected a JSON object"),
        (json.dumps({"timestamp": 0, "input_length": 5, "output_length": 1}), "'hash_ids'"),
        (_line(timestamp="soon"), "timestamp must be a number"),
        (_line(timestamp=-1), "timestamp must be >= 0"),
        (_line(input_length=0, hash_ids=[]), "input_length must be >= 1"),
        (_line(input_length=12.5), "input_length must be an integer"),
        (_line(output_length=-3), "output_length must be >= 0"),
        (_line(hash_ids=[1, "x"]), "hash_ids must be a list of non-negative integers"),
        (_line(hash_ids=[1]), "hash_ids has 1 blocks but input_length 600 needs 2"),
    ],
    ids=[
        "not-json",
        "not-object",
        "missing-field",
        "string-timestamp",
        "negative-timestamp",
        "zero-input",
        "float-input",
        "negative-output",
        "bad-hash-id",
        "block-count-mismatch",
    ],
)
def test_mooncake_bad_line_names_file_and_line(bad: str, message: str) -> None:
    lines = [_line(), "", _line(timestamp=5), bad, _line(timestamp=9)]
    with pytest.raises(TraceError) as exc:
        parse_mooncake(lines, "trace.jsonl")
    assert str(exc.value).startswith("trace.jsonl:4: ")
    assert message in str(exc.value)


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ("2023-11-16 18:15:47.0,12", "expected 3 columns"),
        ("yesterday,12,3", "neither a datetime nor seconds"),
        ("2023-11-16 18:15:47.0,many,3", "ContextTokens must be an integer"),
        ("2023-11-16 18:15:47.0,0,3", "ContextTokens must be >= 1"),
        ("2023-11-16 18:15:47.0,10,-1", "GeneratedTokens must be >= 0"),
    ],
    ids=["short-row", "bad-timestamp", "bad-context", "zero-context", "negative-generated"],
)
def test_azure_bad_line_names_file_and_line(bad: str, message: str) -> None:
    lines = [
        "TIMESTAMP,ContextTokens,GeneratedTokens",
        "2023-11-16 18:15:46.6805900,374,44",
        bad,
        "2023-11-16 18:15:48.0,10,1",
    ]
    with pytest.raises(TraceError) as exc:
        parse_azure(lines, "conv.csv")
    assert str(exc.value).startswith("conv.csv:3: ")
    assert message in str(exc.value)


def test_azure_header_is_required_and_columns_may_be_reordered() -> None:
    with pytest.raises(TraceError, match=r"conv\.csv:1: header must name"):
        parse_azure(["a,b,c", "1,2,3"], "conv.csv")
    reqs = parse_azure(["GeneratedTokens,TIMESTAMP,ContextTokens", "7,12.5,100"], "conv.csv")
    assert (reqs[0].input_length, reqs[0].output_length) == (100, 7)


def test_load_trace_detects_format_and_reports_unreadable_files(tmp_path: Path) -> None:
    p = tmp_path / "trace.txt"
    p.write_text(_line() + "\n", encoding="utf-8")
    assert load_trace(p).format == "mooncake"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n0,5,1\n", encoding="utf-8")
    assert load_trace(p).format == "azure"
    with pytest.raises(TraceError, match="cannot read trace"):
        load_trace(tmp_path / "missing.jsonl")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n", encoding="utf-8")
    with pytest.raises(TraceError, match="no requests"):
        load_trace(empty)
