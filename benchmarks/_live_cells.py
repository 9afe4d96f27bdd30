"""goodput_live's cells and what their runs mean (pure: strings and routing_compare JSON
documents in, dicts and Markdown out, so the smoke tests check them without running
anything).

A cell is a trace slice at a rate: ``KIND:OFFSET:REQUESTS:RATE`` (``agentic:1800:300:0.5``:
the agentic trace's requests 1800-2099, arrivals compressed by 0.5). Each cell is one
``routing_compare.py`` run (every router ``--runs`` times, interleaved); per router the means
and ranges over its runs, the ratios to ``sglang:cache_aware`` against the targets, and the
cell's ceiling (``_goodput_ceiling.py``).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "BASE",
    "KINDS",
    "PRESETS",
    "Cell",
    "cell_report",
    "markdown",
    "parse_cells",
    "summary",
]

KINDS = ("agentic", "conversation")
BASE = "sglang:cache_aware"
# (ratio name, metric, target, applies to agentic cells only)
TARGETS: tuple[tuple[str, str, str, bool], ...] = (
    ("goodput", "goodput_rps", ">= 1.0", True),
    ("ttft_mean", "ttft_mean_ms", "<= 0.8", False),
    ("tpot_mean", "tpot_mean_ms", "<= 1.0", False),
)
AGENTIC_MEAN_GOODPUT_TARGET = 1.3
TIMES = "\u00d7"  # the Markdown's ratios, as the README prints them


@dataclass(frozen=True)
class Cell:
    kind: str
    offset: int
    requests: int
    rate: float

    @property
    def key(self) -> str:
        return f"{self.kind}:{self.offset}:{self.requests}:{self.rate:g}"


def _preset_matrix() -> tuple[Cell, ...]:
    # the held-out agentic offsets of goodput_sim plus the trace's last 300 requests
    # (3148-3447), disjoint from them; conversation slices as in goodput_sim
    agentic = [Cell("agentic", off, 300, rate) for rate in (0.5, 1.0)
               for off in (287, 861, 1435, 2009, 2583, 3148)]  # fmt: skip
    conv = [Cell("conversation", off, 400, 2.5) for off in (2000, 6000, 10000)]
    return (*agentic, *conv)


PRESETS: dict[str, tuple[Cell, ...]] = {"matrix": _preset_matrix()}


def parse_cell(text: str) -> Cell:
    """``KIND:OFFSET:REQUESTS:RATE``; raises ``ValueError`` with the reason."""
    parts = text.strip().split(":")
    if len(parts) != 4:
        raise ValueError(f"cell {text!r}: want KIND:OFFSET:REQUESTS:RATE")
    kind, off, n, rate = parts
    if kind not in KINDS:
        raise ValueError(f"cell {text!r}: kind must be one of {', '.join(KINDS)}")
    try:
        cell = Cell(kind, int(off), int(n), float(rate))
    except ValueError:
        raise ValueError(
            f"cell {text!r}: OFFSET and REQUESTS are integers, RATE a number"
        ) from None
    if cell.offset < 0 or cell.requests < 1 or not cell.rate > 0:
        raise ValueError(f"cell {text!r}: want OFFSET >= 0, REQUESTS >= 1, RATE > 0")
    return cell


def parse_cells(text: str, preset: str | None = None) -> list[Cell]:
    """The preset's cells, then those of the comma list, each once, in that order."""
    cells = list(PRESETS[preset]) if preset else []
    cells += [parse_cell(t) for t in text.split(",") if t.strip()]
    seen: set[str] = set()
    out = []
    for c in cells:
        if c.key not in seen:
            seen.add(c.key)
            out.append(c)
    return out


# -- one cell ---------------------------------------------------------------------------


def _routers(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per router: runs, errors, CPU-saturated runs, and the metrics' means and ranges."""
    out: dict[str, dict[str, Any]] = {}
    for name, entry in (doc.get("per_router") or {}).items():
        runs = [r for r in doc.get("results", []) if r.get("router") == name and "error" not in r]
        saturated = sum(bool((r.get("cpu") or {}).get("saturated")) for r in runs)
        out[name] = {
            "runs": entry.get("runs", 0),
            "errors": entry.get("errors", 0),
            "cpu_saturated_runs": saturated,
            "any_cpu_saturated": saturated > 0,
            "metrics": entry.get("metrics", {}),
        }
    return out


def _mean(routers: dict[str, dict[str, Any]], name: str, metric: str) -> float | None:
    m = (routers.get(name) or {}).get("metrics", {}).get(metric)
    return float(m["mean"]) if m and m.get("mean") is not None else None


def _ratios(routers: dict[str, dict[str, Any]], agentic: bool) -> dict[str, Any]:
    """Each router's ratios of means to ``BASE``, with the targets that apply to the cell."""
    out: dict[str, Any] = {}
    for name in routers:
        if name == BASE or BASE not in routers:
            continue
        entry: dict[str, Any] = {}
        for ratio, metric, target, agentic_only in TARGETS:
            me, base = _mean(routers, name, metric), _mean(routers, BASE, metric)
            value = round(me / base, 3) if me is not None and base else None
            entry[ratio] = value
            if value is None and base == 0 and me is not None:
                entry[f"{ratio}_baseline_zero"] = True
            if agentic_only and not agentic:
                continue
            op, limit = target.split()
            entry[f"{ratio}_target"] = target
            if entry.get(f"{ratio}_baseline_zero"):
                # no ratio to a baseline of zero (a 1x cell where cache_aware met no SLO);
                # a lower bound is met by anything above it, an upper bound by zero alone
                entry[f"{ratio}_met"] = (me or 0.0) > 0 if op == ">=" else not me
                continue
            entry[f"{ratio}_met"] = value is not None and (
                value >= float(limit) if op == ">=" else value <= float(limit)
            )
        out[name] = entry
    return out


def cell_report(
    cell: Cell,
    rules: str,
    doc: dict[str, Any],
    ceiling: dict[str, Any],
    routers: Sequence[str],
    runs: int,
) -> dict[str, Any]:
    """One cell under one rule set from its routing_compare document. ``complete``: every
    router of ``routers`` produced ``runs`` results."""
    per = _routers(doc)
    complete = all(
        (per.get(r) or {}).get("runs") == runs and not (per.get(r) or {}).get("errors")
        for r in routers
    )
    return {
        "cell": cell.key, "kind": cell.kind, "offset": cell.offset, "requests": cell.requests,
        "rate_scale": cell.rate, "rules": rules, "complete": complete,
        "ceiling": ceiling, "routers": per,
        "vs_cache_aware": _ratios(per, cell.kind == "agentic"),
        "any_cpu_saturated": any(p["any_cpu_saturated"] for p in per.values()),
        "engine_profile": (doc.get("fleet") or {}).get("profile"),
        "machine": doc.get("machine"),  # cores, load average before, git commit
        "log_dir": doc.get("log_dir"),
    }  # fmt: skip


# -- over cells -------------------------------------------------------------------------


def _spread(values: list[float]) -> dict[str, Any] | None:
    if not values:
        return None
    return {"mean": round(statistics.fmean(values), 3), "min": round(min(values), 3),
            "max": round(max(values), 3), "cells": len(values)}  # fmt: skip


def _over(reports: list[dict[str, Any]], name: str) -> dict[str, Any]:
    """One router's ratios over cells, and the targets on them."""
    out: dict[str, Any] = {}
    agentic = [r for r in reports if r["kind"] == "agentic"]
    for ratio, _, target, agentic_only in TARGETS:
        pool = agentic if agentic_only else reports
        got = [(r["vs_cache_aware"].get(name) or {}).get(ratio) for r in pool]
        vals = [float(v) for v in got if v is not None]
        met = [r["cell"] for r in pool if (r["vs_cache_aware"].get(name) or {}).get(f"{ratio}_met")]
        out[ratio] = {"per_cell": _spread(vals), "target_per_cell": target,
                      "cells_met": len(met), "cells": len(pool)}  # fmt: skip
    g = out["goodput"]["per_cell"]
    out["goodput"]["agentic_mean_target"] = f">= {AGENTIC_MEAN_GOODPUT_TARGET}"
    out["goodput"]["agentic_mean_met"] = bool(g and g["mean"] >= AGENTIC_MEAN_GOODPUT_TARGET)
    mine = [m for r in agentic if (m := _mean(r["routers"], name, "goodput_rps")) is not None]
    base = [m for r in agentic if (m := _mean(r["routers"], BASE, "goodput_rps")) is not None]
    out["goodput"]["agentic_ratio_of_means"] = (
        round(statistics.fmean(mine) / statistics.fmean(base), 3)
        if mine and base and len(mine) == len(base) and statistics.fmean(base)
        else None
    )
    return out


def summary(reports: list[dict[str, Any]], wanted: Sequence[tuple[str, str]]) -> dict[str, Any]:
    """Per rule set over its complete cells: each router's ratios to ``BASE`` (the goodput
    ones over agentic cells), the incomplete and CPU-saturated cells; and which of ``wanted``
    (cell key, rules) have no complete report."""
    out: dict[str, Any] = {}
    for rules in sorted({r["rules"] for r in reports}):
        mine = [r for r in reports if r["rules"] == rules]
        done = [r for r in mine if r["complete"]]
        routers = sorted({n for r in done for n in r["vs_cache_aware"]})
        out[rules] = {
            "cells_complete": len(done),
            "cells_incomplete": [r["cell"] for r in mine if not r["complete"]],
            "cells_cpu_saturated": [r["cell"] for r in done if r["any_cpu_saturated"]],
            "vs_cache_aware": {n: _over(done, n) for n in routers},
        }
    have = {(r["cell"], r["rules"]) for r in reports if r["complete"]}
    out["missing"] = [f"{k} ({rules})" for k, rules in wanted if (k, rules) not in have]
    return out


# -- Markdown ---------------------------------------------------------------------------

_ROWS: tuple[tuple[str, str, str, float, str], ...] = (
    # (figure, metric, unit, scale, format)
    ("goodput", "goodput_rps", " req/s", 1.0, ".3f"),
    ("SLO attainment", "slo_attainment", "", 1.0, ".3f"),
    ("TTFT mean", "ttft_mean_ms", " s", 0.001, ".2f"),
    ("TTFT p90", "ttft_p90_ms", " s", 0.001, ".1f"),
    ("TPOT mean", "tpot_mean_ms", " ms", 1.0, ".1f"),
    ("cache hit", "cache_hit_ratio", "", 1.0, ".3f"),
)
_RATIO_OF = {"goodput_rps": "goodput", "ttft_mean_ms": "ttft_mean", "tpot_mean_ms": "tpot_mean"}


def _label(router: str) -> str:
    kind, _, policy = router.partition(":")
    return f"Tideserve `{policy}`" if kind == "tideserve" else f"sglang-router `{policy}`"


def _figure(m: dict[str, Any] | None, unit: str, scale: float, fmt: str) -> str:
    if not m:
        return "-"
    lo, hi = format(m["min"] * scale, fmt), format(m["max"] * scale, fmt)
    return f"{format(m['mean'] * scale, fmt)}{unit} ({lo}-{hi})"


def _ratio_cell(report: dict[str, Any], ours: str | None, metric: str) -> tuple[str, str]:
    ratio = _RATIO_OF.get(metric)
    entry = report["vs_cache_aware"].get(ours or "") or {}
    if ratio is None or (entry.get(ratio) is None and not entry.get(f"{ratio}_baseline_zero")):
        return "", ""
    text = "- (baseline 0)" if entry[ratio] is None else f"{entry[ratio]:.2f}{TIMES}"
    target = entry.get(f"{ratio}_target")
    if target is None:
        return text, ""
    op, limit = target.split()
    bound = f"{'≥' if op == '>=' else '≤'} {float(limit):.1f}{TIMES}"
    return (f"**{text}**" if entry[f"{ratio}_met"] else text), bound


def cell_markdown(report: dict[str, Any]) -> str:
    """One cell's table in the README's shape (means, range over runs)."""
    names = list(report["routers"])
    ours = next((n for n in names if n != BASE), None)
    ceiling = report["ceiling"].get("max_attainment")
    runs = ", ".join(f"{n} {p['runs']}" for n, p in report["routers"].items())
    sat = [n for n, p in report["routers"].items() if p["any_cpu_saturated"]]
    m = report.get("machine") or {}
    lines = [
        f"**{report['kind']} {report['offset']}** ({report['requests']} requests) "
        f"@{report['rate_scale']:g}x, {'old rules' if report['rules'] == 'old' else 'rules of record'}"
        f"; runs: {runs}; max attainment {ceiling}; "
        f"CPU-saturated: {', '.join(sat) if sat else 'none'}; commit {m.get('git_commit')}, "
        f"load average before {m.get('loadavg_1m_before')}"
        f"{'' if report['complete'] else '; INCOMPLETE'}",
        "",
        "| figure | " + " | ".join(_label(n) for n in names) + " | ratio | target |",
        "|---" * (len(names) + 3) + "|",
    ]
    for figure, metric, unit, scale, fmt in _ROWS:
        cols = [_figure(report["routers"][n]["metrics"].get(metric), unit, scale, fmt)
                for n in names]  # fmt: skip
        ratio, target = _ratio_cell(report, ours, metric)
        lines.append(f"| {figure} | " + " | ".join(cols) + f" | {ratio} | {target} |")
    return "\n".join(lines)


def markdown(reports: list[dict[str, Any]], summ: dict[str, Any]) -> str:
    """Every cell's table, then the targets over cells per rule set."""
    parts = [cell_markdown(r) for r in reports]
    for rules, s in summ.items():
        if rules == "missing":
            continue
        for name, over in s["vs_cache_aware"].items():
            g = over["goodput"]
            gp = g["per_cell"] or {}
            parts.append(
                f"{'Old rules' if rules == 'old' else 'Rules of record'}, {_label(name)} vs "
                f"`cache_aware` over {s['cells_complete']} cells: goodput mean ratio over "
                f"agentic cells {gp.get('mean', '-')} (target ≥ {AGENTIC_MEAN_GOODPUT_TARGET}; "
                f"ratio of mean goodputs {g['agentic_ratio_of_means'] or '-'}), "
                f"≥ 1.0{TIMES} on {g['cells_met']}/{g['cells']} agentic cells; "
                f"TTFT mean ≤ 0.8{TIMES} on {over['ttft_mean']['cells_met']}/{over['ttft_mean']['cells']}; "
                f"TPOT ≤ 1.0{TIMES} on {over['tpot_mean']['cells_met']}/{over['tpot_mean']['cells']}; "
                f"CPU-saturated cells: {', '.join(s['cells_cpu_saturated']) or 'none'}."
            )
    if summ.get("missing"):
        parts.append(f"Not run yet: {', '.join(summ['missing'])}.")
    return "\n\n".join(parts) + "\n"
