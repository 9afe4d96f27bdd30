"""Trace readers for the benchmark: Mooncake JSONL and Azure LLM-inference CSV.

Contract: every reader validates the WHOLE input before returning, so the bench never sends
a request from a trace that has a bad line further down. A bad line raises ``TraceError``
naming the file and the 1-based line number. Parsing is pure (``parse_*`` take lines);
``load_trace`` only adds reading the file.

Mooncake JSONL, one request a line: ``{"timestamp": ms, "input_length": n,
"output_length": n, "hash_ids": [int, ...]}`` with ``len(hash_ids) == ceil(input_length /
512)``; equal ids mean an equal prefix up to and including that block. Unknown extra keys are
ignored. Azure CSV: header ``TIMESTAMP,ContextTokens,GeneratedTokens`` (any column order);
timestamps are datetimes (``2023-11-16 18:15:46.6805900``), made relative to the first row.

Requests are returned in arrival order (stable sort by timestamp); ``arrival_s`` is relative
to the earliest request, which arrives at 0.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

MOONCAKE_BLOCK_TOKENS = 512

TraceFormat = Literal["mooncake", "azure"]
FORMATS: tuple[str, ...] = ("mooncake", "azure", "auto")


class TraceError(ValueError):
    """A trace that cannot be replayed; the message names the file and line."""


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a trace.

    ``index`` is the position in arrival order (0-based); ``line`` the 1-based source line.
    ``hash_ids`` is None for traces without prefix information (Azure).
    """

    index: int
    line: int
    arrival_s: float
    input_length: int
    output_length: int
    hash_ids: Sequence[int] | None = None  # a tuple when read from a file


@dataclass(frozen=True, slots=True)
class Trace:
    path: str
    format: TraceFormat
    requests: tuple[TraceRequest, ...]
    block_tokens: int = MOONCAKE_BLOCK_TOKENS


def _fail(source: str, line: int, msg: str) -> TraceError:
    return TraceError(f"{source}:{line}: {msg}")


def _positive_int(value: object, field: str, source: str, line: int, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(source, line, f"{field} must be an integer, got {value!r}")
    if value < minimum:
        raise _fail(source, line, f"{field} must be >= {minimum}, got {value}")
    return value


def _sorted(raw: list[tuple[float, int, int, int, tuple[int, ...] | None]]) -> list[TraceRequest]:
    raw.sort(key=lambda r: r[0])  # stable: equal timestamps keep file order
    t0 = raw[0][0] if raw else 0.0
    return [
        TraceRequest(
            index=i, line=line, arrival_s=t - t0, input_length=n_in, output_length=n_out, hash_ids=h
        )
        for i, (t, line, n_in, n_out, h) in enumerate(raw)
    ]


def parse_mooncake(
    lines: Iterable[str], source: str = "<trace>", *, block_tokens: int = MOONCAKE_BLOCK_TOKENS
) -> list[TraceRequest]:
    """Parse Mooncake JSONL lines (blank lines are skipped). Raises TraceError."""
    raw: list[tuple[float, int, int, int, tuple[int, ...] | None]] = []
    for lineno, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            raise _fail(source, lineno, f"not valid JSON ({exc.msg})") from None
        if not isinstance(obj, dict):
            raise _fail(source, lineno, "expected a JSON object")
        for key in ("timestamp", "input_length", "output_length", "hash_ids"):
            if key not in obj:
                raise _fail(source, lineno, f"missing field {key!r}")
        ts = obj["timestamp"]
        if isinstance(ts, bool) or not isinstance(ts, int | float) or not math.isfinite(ts):
            raise _fail(source, lineno, f"timestamp must be a number of ms, got {ts!r}")
        if ts < 0:
            raise _fail(source, lineno, f"timestamp must be >= 0, got {ts}")
        n_in = _positive_int(obj["input_length"], "input_length", source, lineno, minimum=1)
        n_out = _positive_int(obj["output_length"], "output_length", source, lineno, minimum=0)
        ids = obj["hash_ids"]
        if not isinstance(ids, list) or not all(
            isinstance(h, int) and not isinstance(h, bool) and h >= 0 for h in ids
        ):
            raise _fail(source, lineno, "hash_ids must be a list of non-negative integers")
        want = math.ceil(n_in / block_tokens)
        if len(ids) != want:
            raise _fail(
                source,
                lineno,
                f"hash_ids has {len(ids)} blocks but input_length {n_in} needs {want} "
                f"blocks of {block_tokens} tokens",
            )
        raw.append((float(ts) / 1000.0, lineno, n_in, n_out, tuple(ids)))
    return _sorted(raw)


def _parse_datetime(value: str) -> float:
    """Seconds of a datetime (naive = UTC, so the machine's zone never matters) or a number.

    Azure writes 7 fractional digits; fromisoformat keeps microseconds, which is enough.
    """
    value = value.strip()
    try:
        dt = datetime.fromisoformat(value)
    except ValueError:
        try:
            return float(value)  # already relative seconds
        except ValueError:
            raise ValueError(f"TIMESTAMP {value!r} is neither a datetime nor seconds") from None
    return (dt if dt.tzinfo else dt.replace(tzinfo=UTC)).timestamp()


def parse_azure(lines: Iterable[str], source: str = "<trace>") -> list[TraceRequest]:
    """Parse Azure LLM-inference CSV lines (header first). Raises TraceError."""
    reader = csv.reader(lines)
    header: Sequence[str] | None = None
    cols: dict[str, int] = {}
    raw: list[tuple[float, int, int, int, tuple[int, ...] | None]] = []
    rows = iter(reader)
    while True:
        try:
            row = next(rows)
        except StopIteration:
            break
        except csv.Error as exc:  # e.g. a stray carriage return inside a field
            raise _fail(source, reader.line_num, f"not valid CSV ({exc})") from None
        lineno = reader.line_num
        if not row or all(not c.strip() for c in row):
            continue
        if header is None:
            header = [c.strip().lower() for c in row]
            for name in ("timestamp", "contexttokens", "generatedtokens"):
                if name not in header:
                    raise _fail(
                        source,
                        lineno,
                        "header must name TIMESTAMP, ContextTokens and GeneratedTokens, "
                        f"got {','.join(row)!r}",
                    )
                cols[name] = header.index(name)
            continue
        if len(row) != len(header):
            raise _fail(source, lineno, f"expected {len(header)} columns, got {len(row)}")
        try:
            ts = _parse_datetime(row[cols["timestamp"]])
        except ValueError as exc:
            raise _fail(source, lineno, str(exc)) from None
        values: list[int] = []
        for name, label, minimum in (
            ("contexttokens", "ContextTokens", 1),
            ("generatedtokens", "GeneratedTokens", 0),
        ):
            cell = row[cols[name]].strip()
            try:
                v = int(cell)
            except ValueError:
                raise _fail(source, lineno, f"{label} must be an integer, got {cell!r}") from None
            values.append(_positive_int(v, label, source, lineno, minimum=minimum))
        raw.append((ts, lineno, values[0], values[1], None))
    if header is None:
        raise _fail(source, 1, "empty file (no CSV header)")
    return _sorted(raw)


def detect_format(path: Path, first_line: str) -> TraceFormat:
    """``mooncake`` for .jsonl/.json or a line starting with '{', else ``azure``."""
    if path.suffix.lower() in (".jsonl", ".json"):
        return "mooncake"
    if path.suffix.lower() == ".csv":
        return "azure"
    return "mooncake" if first_line.lstrip().startswith("{") else "azure"


def load_trace(path: str | Path, fmt: str = "auto") -> Trace:
    """Read and validate a whole trace file. Raises TraceError (also for I/O problems)."""
    p = Path(path)
    if fmt not in FORMATS:
        raise TraceError(f"{p}: unknown trace format {fmt!r} (choose from {', '.join(FORMATS)})")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceError(f"{p}: cannot read trace: {exc}") from None
    lines = text.splitlines()
    chosen: TraceFormat
    if fmt == "auto":
        chosen = detect_format(p, next((ln for ln in lines if ln.strip()), ""))
    else:
        chosen = "mooncake" if fmt == "mooncake" else "azure"
    reqs = parse_mooncake(lines, str(p)) if chosen == "mooncake" else parse_azure(lines, str(p))
    if not reqs:
        raise TraceError(f"{p}: the trace has no requests")
    return Trace(path=str(p), format=chosen, requests=tuple(reqs))
