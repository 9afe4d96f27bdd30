"""Whole-machine CPU saturation check for benchmark runs.

Simulated engines, a gateway and the load generator share the machine's cores; when the
cores are saturated, latencies measure the CPU queue, not the system under test. The runner
samples ``psutil.cpu_percent(percpu=True)`` periodically (``CpuSampler``); ``assess_cpu``
(pure) decides: saturated when the mean total use over the run exceeds ``mean_threshold``
or when total use stays at or above ``window_threshold`` for ``window_s`` in a row.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import psutil

MEAN_THRESHOLD = 90.0
WINDOW_THRESHOLD = 97.0
WINDOW_S = 5.0


def assess_cpu(
    samples: Sequence[Sequence[float]],
    interval_s: float,
    *,
    process_percent: Sequence[float] = (),
    mean_threshold: float = MEAN_THRESHOLD,
    window_threshold: float = WINDOW_THRESHOLD,
    window_s: float = WINDOW_S,
) -> dict[str, Any]:
    """The ``cpu`` block of the summary from per-core percentages sampled every interval.

    ``process_percent`` is the bench process's own use (100 = one core), reported as is.
    """
    totals = [sum(s) / len(s) for s in samples if s]
    need = max(1, math.ceil(window_s / interval_s)) if interval_s > 0 else 1
    run = best = 0
    for t in totals:
        run = run + 1 if t >= window_threshold else 0
        best = max(best, run)
    sustained = best >= need
    mean_total = sum(totals) / len(totals) if totals else None
    cores = max((len(s) for s in samples), default=0)
    per_core = [
        round(sum(s[i] for s in samples if len(s) > i) / max(1, len(totals)), 1)
        for i in range(cores)
    ]
    saturated = bool(totals) and (sustained or (mean_total or 0.0) > mean_threshold)
    return {
        "saturated": saturated,
        "cores": cores,
        "samples": len(totals),
        "interval_s": interval_s,
        "mean_total_percent": None if mean_total is None else round(mean_total, 1),
        "max_total_percent": round(max(totals), 1) if totals else None,
        "per_core_mean_percent": per_core,
        "longest_busy_window_s": round(best * interval_s, 3),
        "bench_process_mean_percent": (
            round(sum(process_percent) / len(process_percent), 1) if process_percent else None
        ),
        "rule": (
            f"mean total > {mean_threshold}% or >= {window_threshold}% for {window_s}s in a row"
        ),
    }


class CpuSampler:
    """Collects CPU samples when ``sample()`` is called (non-blocking psutil calls)."""

    def __init__(self, interval_s: float = 1.0) -> None:
        self.interval_s = interval_s
        self.samples: list[list[float]] = []
        self.process_samples: list[float] = []
        self._proc = psutil.Process()
        psutil.cpu_percent(interval=None, percpu=True)  # prime: the first call returns 0s
        self._proc.cpu_percent(interval=None)

    def sample(self) -> None:
        self.samples.append(list(psutil.cpu_percent(interval=None, percpu=True)))
        self.process_samples.append(self._proc.cpu_percent(interval=None))

    def assess(self) -> dict[str, Any]:
        return assess_cpu(self.samples, self.interval_s, process_percent=self.process_samples)
