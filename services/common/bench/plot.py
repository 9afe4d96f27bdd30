"""Plots of a run: latency CDFs and a request timeline (needs matplotlib).

matplotlib is the optional extra ``tideserve[plot]`` (and a test dependency) and is imported
only when a plot is asked for; without it the writers raise ``PlotUnavailable`` with the
install hint. ``write_plot`` draws one bench run; ``write_cdf_plot`` (one CDF per named
series, e.g. TTFT per router) and ``write_series_plot`` (lines over time with an optional
second axis, e.g. replicas against the request rate) serve the benchmarks' ``--plot``.
``cdf_points`` and ``timeline_points`` are pure and tested without matplotlib.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from services.common.bench.stats import RequestResult


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed."""


def cdf_points(values: Sequence[float]) -> tuple[list[float], list[float]]:
    """(sorted values, cumulative fraction) for a step CDF; empty input gives empty lists."""
    xs = sorted(values)
    n = len(xs)
    return xs, [(i + 1) / n for i in range(n)]


def timeline_points(results: Sequence[RequestResult], scale: float = 1.0) -> dict[str, list[float]]:
    """Per-request send time (s) and TTFT/E2E (ms) of completed requests, and failure times."""
    ok = [r for r in results if r.ok and r.ttft_s is not None and r.e2e_s is not None]
    return {
        "sent_s": [r.sent_s * scale for r in ok],
        "ttft_ms": [(r.ttft_s or 0.0) * 1000.0 * scale for r in ok],
        "e2e_ms": [(r.e2e_s or 0.0) * 1000.0 * scale for r in ok],
        "failed_s": [r.sent_s * scale for r in results if not r.ok],
    }


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlotUnavailable(
            "--plot needs matplotlib: pip install 'tideserve[plot]' (or pip install matplotlib)"
        ) from None
    return plt


def ensure_available() -> None:
    """Raise PlotUnavailable now, so a run is not wasted on a plot that cannot be drawn."""
    _pyplot()


def write_plot(path: str | Path, results: Sequence[RequestResult], scale: float = 1.0) -> None:
    """Write a PNG with TTFT/TPOT/E2E CDFs and a TTFT/E2E timeline. Raises PlotUnavailable."""
    plt = _pyplot()
    fig, (ax_cdf, ax_tl) = plt.subplots(1, 2, figsize=(12, 4.5))
    ok = [r for r in results if r.ok]
    series = {
        "TTFT": [r.ttft_s * 1000.0 * scale for r in ok if r.ttft_s is not None],
        "TPOT": [r.tpot_s * 1000.0 * scale for r in ok if r.tpot_s is not None],
        "E2E": [r.e2e_s * 1000.0 * scale for r in ok if r.e2e_s is not None],
    }
    for label, vals in series.items():
        if vals:
            xs, ys = cdf_points(vals)
            ax_cdf.step(xs, ys, where="post", label=label)
    ax_cdf.set_xscale("log")
    ax_cdf.set_xlabel("latency (ms)")
    ax_cdf.set_ylabel("fraction of requests")
    ax_cdf.set_title("latency CDF")
    ax_cdf.legend()
    tl = timeline_points(results, scale)
    ax_tl.scatter(tl["sent_s"], tl["e2e_ms"], s=6, label="E2E")
    ax_tl.scatter(tl["sent_s"], tl["ttft_ms"], s=6, label="TTFT")
    if tl["failed_s"]:
        ax_tl.scatter(tl["failed_s"], [0.0] * len(tl["failed_s"]), marker="x", label="failed")
    ax_tl.set_yscale("symlog")
    ax_tl.set_xlabel("send time (s)")
    ax_tl.set_ylabel("latency (ms)")
    ax_tl.set_title("timeline")
    ax_tl.legend()
    fig.tight_layout()
    fig.savefig(str(path), dpi=110)
    plt.close(fig)


def write_cdf_plot(
    path: str | Path,
    series: Mapping[str, Sequence[float]],
    *,
    xlabel: str,
    title: str,
    log_x: bool = True,
) -> None:
    """One step CDF per named series (empty series are left out). Raises PlotUnavailable."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for label, values in series.items():
        if values:
            xs, ys = cdf_points(values)
            ax.step(xs, ys, where="post", label=label)
    if log_x:
        ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("fraction of requests")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(str(path), dpi=110)
    plt.close(fig)


def write_series_plot(
    path: str | Path,
    x: Sequence[float],
    lines: Mapping[str, Sequence[float]],
    *,
    xlabel: str,
    ylabel: str,
    title: str,
    right: Mapping[str, Sequence[float]] | None = None,
    right_label: str = "",
) -> None:
    """Lines over a shared x axis, ``right`` ones on a second y axis (dashed, grey first).

    Every series must have one value per x. Raises PlotUnavailable, or ValueError for a
    series of the wrong length.
    """
    for name, ys in {**lines, **(right or {})}.items():
        if len(ys) != len(x):
            raise ValueError(f"series {name!r} has {len(ys)} values for {len(x)} x values")
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(11, 4.5))
    handles = []
    for label, ys in lines.items():
        handles += ax.step(x, ys, where="post", label=label, linewidth=1.0)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    if right:
        ax2 = ax.twinx()
        colours = ("0.55", "0.3", "0.75")
        for i, (label, ys) in enumerate(right.items()):
            handles += ax2.plot(
                x, ys, linestyle="--", color=colours[i % 3], label=label, linewidth=0.9
            )
        ax2.set_ylabel(right_label)
    ax.set_title(title)
    ax.legend(handles=handles, loc="upper left", fontsize="small")
    fig.tight_layout()
    fig.savefig(str(path), dpi=110)
    plt.close(fig)
