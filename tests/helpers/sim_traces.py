"""Tiny Mooncake-format traces for the simulator's tests: conversations of two turns that
share their first block."""

from __future__ import annotations

import json
from pathlib import Path

from services.common.bench.traces import Trace, parse_mooncake


def conversation_lines(n: int, gap_ms: int = 250) -> list[str]:
    """Conversations of 2 turns sharing their first 512-token block, 2-3 blocks long."""
    out = []
    for i in range(n):
        conv = i // 2
        out.append(json.dumps({
            "timestamp": i * gap_ms, "input_length": 1100 + 100 * (i % 3),
            "output_length": 20 + i % 5, "hash_ids": [conv * 10, conv * 10 + 1 + i % 2, conv * 10 + 5],
        }))  # fmt: skip
    return out


def trace_of(n: int) -> Trace:
    return Trace("mem.jsonl", "mooncake", tuple(parse_mooncake(conversation_lines(n))))


def write_trace(path: Path, n: int) -> Path:
    path.write_text("\n".join(conversation_lines(n)) + "\n", encoding="utf-8")
    return path
