"""Redis stream entry ids (pure): ``"<ms>-<seq>"``, ``ms`` the server's epoch milliseconds.

Every place that turns a reply's id into text, compares ids, or derives a start id from a
time uses these helpers, so that the arithmetic lives once.
"""

from __future__ import annotations

__all__ = [
    "NEWEST",
    "ZERO",
    "as_id",
    "catchup_start_id",
    "compare_ids",
    "exclusive",
    "format_id",
    "id_from_ms",
    "ms_from_id",
    "next_id",
    "parse_id",
]

ZERO = "0-0"
"""Before every entry: reading after it reads the whole stream."""

NEWEST = "$"
"""XREAD's "after the newest entry" (only meaningful to Redis, never a cursor to keep)."""


def as_id(raw: object) -> str:
    """An id as Redis returned it (bytes with ``decode_responses=False``, else str) as str."""
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def parse_id(entry_id: str) -> tuple[int, int]:
    """``"ms-seq"`` (or ``"ms"``, seq 0) as a comparable ``(ms, seq)``; ValueError otherwise."""
    ms, sep, seq = entry_id.partition("-")
    if not _digits(ms) or (sep and not _digits(seq)):
        raise ValueError(f"not a stream entry id: {entry_id!r}")
    return int(ms), int(seq or 0)


def _digits(text: str) -> bool:
    return text.isascii() and text.isdigit()


def format_id(ms: int, seq: int = 0) -> str:
    """``(ms, seq)`` as an entry id."""
    if ms < 0 or seq < 0:
        raise ValueError(f"stream id parts must be >= 0, got {ms}-{seq}")
    return f"{ms}-{seq}"


def compare_ids(a: str, b: str) -> int:
    """-1, 0 or 1 as ``a`` is before, equal to or after ``b`` (numeric, not textual)."""
    pa, pb = parse_id(a), parse_id(b)
    return (pa > pb) - (pa < pb)


def ms_from_id(entry_id: str) -> int:
    """The milliseconds part: when the server added the entry."""
    return parse_id(entry_id)[0]


def id_from_ms(ms: int) -> str:
    """The first possible id at ``ms`` (negative times clamp to 0)."""
    return format_id(max(0, ms), 0)


def next_id(entry_id: str) -> str:
    """The smallest id after ``entry_id``."""
    ms, seq = parse_id(entry_id)
    return format_id(ms, seq + 1)


def exclusive(entry_id: str) -> str:
    """XRANGE bound that excludes ``entry_id`` itself (``"(ms-seq"``)."""
    parse_id(entry_id)
    return "(" + entry_id


def catchup_start_id(wall_ms: int, window_s: float) -> str:
    """Where to start reading so that a reader starting at wall time ``wall_ms`` still sees
    the entries of the last ``window_s`` seconds."""
    return id_from_ms(wall_ms - int(window_s * 1000.0))
