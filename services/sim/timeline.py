"""The per-window timeline of a run (pure): load, replicas per role, queue and hit ratio.

One row per window of modelled time (a minute by default), closed by the loop's ``sample``
event at the window's end: arrivals and request rate in the window, requests that ended in
it (completed, failed), the engines' running and queued requests at its end (queued =
waiting in an engine plus held in a gateway's dispatch order), the replicas of each role,
and the cache hit ratio of the requests completed in it (cached / prompt tokens).
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from services.common.bench.plot import write_series_plot
from services.sim.records import SimRequest

__all__ = ["COLUMNS", "Timeline", "csv_text", "plot_timeline"]

COLUMNS: tuple[str, ...] = (
    "minute",
    "t_s",
    "arrivals",
    "load_rps",
    "completed",
    "failed",
    "running",
    "queued",
    "replicas_worker",
    "replicas_prefill",
    "replicas_decode",
    "hit_ratio",
)


@dataclass
class _Window:
    arrivals: int = 0
    completed: int = 0
    failed: int = 0
    cached: int = 0
    prompt: int = 0


@dataclass
class Timeline:
    interval_ms: float
    replicas: dict[str, int]
    rows: list[dict[str, Any]] = field(default_factory=list)
    _cur: _Window = field(default_factory=_Window)
    _start: float = 0.0

    def arrived(self, now: float) -> None:
        self._cur.arrivals += 1

    def ended(self, now: float, req: SimRequest) -> None:
        w = self._cur
        if req.error is not None:
            w.failed += 1
            return
        w.completed += 1
        w.cached += req.cached
        w.prompt += req.prompt_tokens

    def sample(self, now: float, running: int, queued: int, *, final: bool = False) -> None:
        """Close the window ending at ``now`` (the partial last one when ``final``)."""
        if now <= self._start and not (final and self._cur != _Window()):
            return
        w, span_s = self._cur, max(now - self._start, 1e-9) / 1000.0
        full_s = self.interval_ms / 1000.0
        self.rows.append(
            {
                "minute": len(self.rows),
                "t_s": round(self._start / 1000.0, 3),
                "arrivals": w.arrivals,
                "load_rps": round(w.arrivals / (span_s if final else full_s), 4),
                "completed": w.completed,
                "failed": w.failed,
                "running": running,
                "queued": queued,
                "replicas_worker": self.replicas.get("worker", 0),
                "replicas_prefill": self.replicas.get("prefill", 0),
                "replicas_decode": self.replicas.get("decode", 0),
                "hit_ratio": round(w.cached / w.prompt, 4) if w.prompt else "",
            }
        )
        self._cur = _Window()
        self._start = now

    def csv_text(self) -> str:
        return csv_text(self.rows)


def csv_text(rows: list[dict[str, Any]]) -> str:
    """The timeline's rows as CSV, ``COLUMNS`` in order."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


def plot_timeline(path: str | Path, rows: list[dict[str, Any]], *, title: str = "") -> None:
    """A PNG of the ready replicas of each role present and the request rate, per window.
    Raises :class:`~services.common.bench.plot.PlotUnavailable` without matplotlib."""
    x = [r["t_s"] / 60.0 for r in rows]
    roles = [k for k in ("worker", "prefill", "decode") if any(r[f"replicas_{k}"] for r in rows)]
    write_series_plot(
        path,
        x,
        {f"{k} replicas": [r[f"replicas_{k}"] for r in rows] for k in roles},
        right={"requests/s": [r["load_rps"] for r in rows]},
        right_label="requests per second",
        xlabel="modelled minutes",
        ylabel="ready replicas",
        title=f"tideserve sim {title}".strip(),
    )
