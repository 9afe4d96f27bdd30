"""The plots: `tideserve bench --plot` and the benchmarks' --plot (matplotlib is a test
dependency, so these run in `make test`)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from services.common.bench.plot import write_cdf_plot, write_plot, write_series_plot
from services.common.bench.stats import RequestResult

PNG = b"\x89PNG\r\n\x1a\n"
BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
# the traces the two benchmarks read by default sit beside the project
TRACES = BENCHMARKS.parent.parent / "shared" / "traces"


def _results() -> list[RequestResult]:
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
    return rs


def _bench(out: Path) -> None:
    write_plot(out, _results())


def _cdfs(out: Path) -> None:
    write_cdf_plot(
        out, {"a": [1.0, 5.0, 20.0], "b": [2.0, 3.0], "empty": []}, xlabel="ms", title="t"
    )


def _series(out: Path) -> None:
    write_series_plot(
        out,
        [0.0, 1.0, 2.0],
        {"replicas": [1.0, 3.0, 2.0]},
        right={"rate": [10.0, 30.0, 20.0]},
        xlabel="s",
        ylabel="n",
        title="t",
        right_label="req/s",
    )


@pytest.mark.parametrize(
    "draw", [_bench, _cdfs, _series], ids=["bench-run", "cdf-per-series", "series-two-axes"]
)
def test_writers_make_a_png(tmp_path: Path, draw: Callable[[Path], None]) -> None:
    out = tmp_path / "plot.png"
    draw(out)
    assert out.read_bytes()[:8] == PNG


def test_series_of_the_wrong_length_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="'rate' has 2 values for 3"):
        write_series_plot(
            tmp_path / "x.png",
            [0.0, 1.0, 2.0],
            {"replicas": [1.0, 2.0, 3.0]},
            right={"rate": [1.0, 2.0]},
            xlabel="",
            ylabel="",
            title="",
        )
    assert not (tmp_path / "x.png").exists()


@pytest.mark.skipif(
    not (TRACES / "mooncake_conversation_trace.jsonl").exists()
    or not (TRACES / "servegen_language_m-large_rate.csv").exists(),
    reason=f"the development traces are not in {TRACES}",
)
@pytest.mark.parametrize(
    ("script", "args"),
    [
        (
            "routing_sim",
            ["--max-requests", "20", "--engines", "2", "--profiles", "default,round_robin"],
        ),
        (
            "autoscaler_eval",
            ["--days", "0.2", "--policies", "planner,static", "--colocation-budget", "0"],
        ),
    ],
    ids=["routing-ttft-cdf", "autoscaler-replicas"],
)
def test_benchmark_plot_option_writes_a_png(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], script: str, args: list[str]
) -> None:
    sys.path.insert(0, str(BENCHMARKS))
    try:
        module = __import__(script)
    finally:
        sys.path.remove(str(BENCHMARKS))
    out = tmp_path / f"{script}.png"
    assert module.main([*args, "--plot", str(out)]) == 0
    capsys.readouterr()
    assert out.read_bytes()[:8] == PNG
