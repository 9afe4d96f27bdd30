"""Stream entry ids (pure helpers of services.common.streams.ids)."""

from __future__ import annotations

import pytest

from services.common.streams.ids import (
    NEWEST,
    ZERO,
    as_id,
    catchup_start_id,
    compare_ids,
    exclusive,
    format_id,
    id_from_ms,
    ms_from_id,
    next_id,
    parse_id,
)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b"1700000000000-3", "1700000000000-3"),
        ("1700000000000-3", "1700000000000-3"),
        (b"0-0", ZERO),
    ],
    ids=["bytes", "str", "zero-bytes"],
)
def test_as_id(raw: object, expected: str) -> None:
    assert as_id(raw) == expected


@pytest.mark.parametrize(
    ("entry_id", "expected"),
    [
        ("0-0", (0, 0)),
        ("1700000000000-0", (1_700_000_000_000, 0)),
        ("5-12", (5, 12)),
        ("42", (42, 0)),
        ("18446744073709551615-18446744073709551615", (2**64 - 1, 2**64 - 1)),
    ],
    ids=["zero", "ms-only-seq", "seq", "ms-without-seq", "max"],
)
def test_parse_id(entry_id: str, expected: tuple[int, int]) -> None:
    assert parse_id(entry_id) == expected


@pytest.mark.parametrize(
    "entry_id",
    [NEWEST, "", "-", "5-", "-5", "a-1", "1-b", "1-2-3", "+", "(5-0", " 5-0", "-1-0"],
    ids=[
        "newest",
        "empty",
        "dash",
        "no-seq",
        "no-ms",
        "ms-letters",
        "seq-letters",
        "three-parts",
        "plus",
        "exclusive-bound",
        "space",
        "negative",
    ],
)
def test_parse_id_rejects(entry_id: str) -> None:
    with pytest.raises(ValueError, match="not a stream entry id"):
        parse_id(entry_id)


@pytest.mark.parametrize(
    ("ms", "seq", "expected"),
    [(0, 0, "0-0"), (1_700_000_000_000, 0, "1700000000000-0"), (5, 7, "5-7")],
    ids=["zero", "ms", "seq"],
)
def test_format_id_round_trips(ms: int, seq: int, expected: str) -> None:
    assert format_id(ms, seq) == expected
    assert parse_id(expected) == (ms, seq)


@pytest.mark.parametrize(("ms", "seq"), [(-1, 0), (0, -1)], ids=["ms", "seq"])
def test_format_id_rejects_negative(ms: int, seq: int) -> None:
    with pytest.raises(ValueError, match=">= 0"):
        format_id(ms, seq)


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ("5-0", "5-0", 0),
        ("5-0", "5", 0),
        ("5-1", "5-0", 1),
        ("5-0", "5-1", -1),
        ("10-0", "9-0", 1),  # numeric, where text order says "10-0" < "9-0"
        ("9-10", "9-9", 1),  # the same for seqs
        ("0-0", "1-0", -1),
    ],
    ids=["equal", "seq-omitted", "seq-after", "seq-before", "ms-numeric", "seq-numeric", "zero"],
)
def test_compare_ids(a: str, b: str, expected: int) -> None:
    assert compare_ids(a, b) == expected
    assert compare_ids(b, a) == -expected


@pytest.mark.parametrize(
    ("entry_id", "ms"),
    [("0-0", 0), ("1700000000123-4", 1_700_000_000_123), ("77", 77)],
    ids=["zero", "with-seq", "ms-only"],
)
def test_ms_from_id(entry_id: str, ms: int) -> None:
    assert ms_from_id(entry_id) == ms


@pytest.mark.parametrize(
    ("ms", "expected"),
    [(0, "0-0"), (1_700_000_000_123, "1700000000123-0"), (-5, "0-0")],
    ids=["zero", "epoch-ms", "negative-clamps"],
)
def test_id_from_ms(ms: int, expected: str) -> None:
    assert id_from_ms(ms) == expected
    assert ms_from_id(expected) == max(0, ms)


@pytest.mark.parametrize(
    ("entry_id", "expected"),
    [("0-0", "0-1"), ("5-9", "5-10"), ("5", "5-1")],
    ids=["zero", "carry-free", "ms-only"],
)
def test_next_id(entry_id: str, expected: str) -> None:
    assert next_id(entry_id) == expected
    assert compare_ids(expected, entry_id) == 1


@pytest.mark.parametrize(
    ("entry_id", "expected"),
    [("0-0", "(0-0"), ("1700000000000-3", "(1700000000000-3")],
    ids=["zero", "id"],
)
def test_exclusive(entry_id: str, expected: str) -> None:
    assert exclusive(entry_id) == expected


def test_exclusive_rejects_a_non_id() -> None:
    with pytest.raises(ValueError, match="not a stream entry id"):
        exclusive(NEWEST)


@pytest.mark.parametrize(
    ("wall_ms", "window_s", "expected"),
    [
        (1_000_000, 600.0, "400000-0"),
        (1_000, 600.0, "0-0"),
        (5_000, 0.0, "5000-0"),
        (5_000, 0.0015, "4999-0"),
    ],
    ids=["window", "clamped", "no-catchup", "sub-ms-window"],
)
def test_catchup_start_id(wall_ms: int, window_s: float, expected: str) -> None:
    assert catchup_start_id(wall_ms, window_s) == expected
