"""The optional plot: a PNG with latency CDFs and a timeline (needs matplotlib)."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.bench.plot import write_plot
from services.bench.stats import RequestResult


def test_write_plot_makes_a_png(tmp_path: Path) -> None:
    pytest.importorskip(
        "matplotlib", reason="matplotlib (optional extra tideserve[plot]) is not installed"
    )
    rs = [
        RequestResult(
            index=i,
            target="t",
            scheduled_s=i * 0.1,
            sent_s=i * 0.1,
            input_length=10,
            output_length=10,
            ttft_s=0.01 * (i + 1),
            tpot_s=0.001 * (i + 1),
            e2e_s=0.1 * (i + 1),
            output_tokens=10,
        )
        for i in range(20)
    ]
    rs.append(RequestResult(index=20, target="t", scheduled_s=1, sent_s=1, input_length=1,
                            output_length=1, error="http 500"))  # fmt: skip
    out = tmp_path / "run.png"
    write_plot(out, rs)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
