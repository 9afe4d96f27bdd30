"""The live goodput matrix: ``routing_compare.py`` over many cells (trace slices at a rate),
each cell's ceiling beside it, resumable over several sittings.

For each cell (``--cells``, ``--preset``): the slice's lines of the trace file (from the
offset, as ``sed -n`` would cut them) go to a temp file; ``routing_compare.py`` replays it
(``--speedup 1``, the cell's ``--rate-scale``) with every router of ``--routers``
``--runs`` times, interleaved, each run on a fresh fleet of 8 simulated engines, under the
figures-of-record rules (``--old-rules``: the earlier favourable ones); its JSON gives per
router the means and ranges. The cell's ceiling (``max_attainment``: 1 - the share of
requests no router could serve within the TTFT SLO) is computed from the same slice as
``goodput_sim.py`` computes it (``_goodput_ceiling.py``), with the profile the engines ran.

Each finished cell goes into ``--state`` at once, so a matrix can run over several sittings:
cells already there (same rules, complete) are skipped. The old rules go into the same state
file beside the new ones (run the same command with ``--old-rules``); the report shows both.

    # the full matrix (12 agentic cells, 3 conversation cells; ~10-12 min per agentic cell
    # at 0.5x on a quiet machine), then the old rules beside it where affordable:
    .venv/bin/python benchmarks/goodput_live.py --preset matrix \\
        --state /tmp/goodput_live_state.json --out /tmp/goodput_live.json --markdown
    .venv/bin/python benchmarks/goodput_live.py --preset matrix --old-rules \\
        --state /tmp/goodput_live_state.json --out /tmp/goodput_live.json --markdown
    # what is left to run, and the report so far, without running anything:
    .venv/bin/python benchmarks/goodput_live.py --preset matrix --plan \\
        --state /tmp/goodput_live_state.json
    .venv/bin/python benchmarks/goodput_live.py --preset matrix --report \\
        --state /tmp/goodput_live_state.json --markdown

Output: per cell and rule set, per router the means and ranges over its runs (goodput, SLO
attainment, TTFT mean/p90, TPOT mean, cache hit), whether any run was CPU-saturated (such a
figure is not a clean one), the ratios to ``sglang:cache_aware`` against the targets
(goodput >= 1.0x per agentic cell and >= 1.3x on the mean over agentic cells, TTFT mean
<= 0.8x, TPOT mean <= 1.0x) and the ceiling; a summary over cells. Exit code 0 when every
requested cell is complete, 1 otherwise, 2 for bad arguments or a state file of other
settings.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import (
    MOONCAKE_CONVERSATION,
    ROOT,
    TRACES,
    command_line,
    run_child,
    unwind_on_sigterm,
)
from _live_cells import PRESETS, Cell, cell_report, markdown, parse_cells, summary

AGENTIC = TRACES / "weka_agentic_dev.jsonl"
COMPARE = Path(__file__).resolve().parent / "routing_compare.py"
ROUTERS = "tideserve:default,sglang:cache_aware"
SPEEDUP = 1.0
BLOCK_SIZE = 64  # the engines' KV block (``tideserve engine --block-size`` default)
STATE_VERSION = 1


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--cells", default="",
                   help="comma list of KIND:OFFSET:REQUESTS:RATE (KIND: agentic, conversation)")  # fmt: skip
    p.add_argument("--preset", choices=sorted(PRESETS), default=None,
                   help="matrix: agentic 287,861,1435,2009,2583,3148 (300 requests) at 0.5 and "
                   "1, conversation 2000,6000,10000 (400 requests) at 2.5; --cells adds to it")  # fmt: skip
    p.add_argument("--runs", type=int, default=2, help="runs per router per cell (default 2)")
    p.add_argument("--routers", default=ROUTERS, help=f"comma list (default {ROUTERS})")
    p.add_argument("--old-rules", action="store_true", help="routing_compare's --old-rules")
    p.add_argument("--state", default=None, help="JSON of finished cells (resume from it)")
    p.add_argument("--out", default=None, help="the report's JSON")
    p.add_argument("--markdown", action="store_true", help="print Markdown tables, not JSON")
    p.add_argument("--plan", action="store_true", help="list the cells left and their commands")
    p.add_argument("--report", action="store_true", help="report from --state, run nothing")
    p.add_argument("--log-dir", default=None, help="routing_compare's logs, per cell under it")
    p.add_argument("--parallel", action="store_true",
                   help="run a cell's routers and runs at once, each its own routing_compare "
                   "on its own fleet, instead of one after the other: for sparse cells, whose "
                   "fleets idle most of the time. Every fleet starts before any bench does, the "
                   "benches a few seconds apart; each run still flags a CPU-saturated machine. "
                   "Run one such cell at a time and nothing else beside it: twelve idle fleets "
                   "kept the machine about half busy, and any start-up then saturates it")  # fmt: skip
    p.add_argument("--agentic-trace", default=str(AGENTIC))
    p.add_argument("--conv-trace", default=str(MOONCAKE_CONVERSATION))
    return p.parse_args(argv)


def routers_of(args: argparse.Namespace) -> list[str]:
    return [r.strip() for r in args.routers.split(",") if r.strip()]


def rules_of(args: argparse.Namespace) -> str:
    return "old" if args.old_rules else "new"


def settings_of(args: argparse.Namespace) -> dict[str, Any]:
    """What every cell of one state file shares (a cell of other settings is not resumed)."""
    return {"routers": args.routers, "runs": args.runs, "speedup": SPEEDUP}


def trace_of(cell: Cell, args: argparse.Namespace) -> Path:
    return Path(args.agentic_trace if cell.kind == "agentic" else args.conv_trace)


def write_slice(trace: Path, cell: Cell, dest: Path) -> Path:
    """Lines ``offset + 1`` .. ``offset + requests`` of ``trace`` (``sed -n A,Bp``)."""
    with trace.open(encoding="utf-8") as src:
        lines = [ln for i, ln in enumerate(src) if cell.offset <= i < cell.offset + cell.requests]
    if len(lines) < cell.requests:
        raise ValueError(f"{cell.key}: {trace} has only {cell.offset + len(lines)} lines")
    dest.write_text("".join(lines), encoding="utf-8")
    return dest


def check_slices(cells: list[Cell], args: argparse.Namespace) -> None:
    """``ValueError`` for a cell reaching past the end of its trace (the bench would repeat
    the slice instead)."""
    lines: dict[Path, int] = {}
    for c in cells:
        path = trace_of(c, args)
        if path not in lines:
            with path.open(encoding="utf-8") as f:
                lines[path] = sum(1 for _ in f)
        if c.offset + c.requests > lines[path]:
            raise ValueError(f"{c.key}: {path} has {lines[path]} requests")


def compare_argv(
    cell: Cell,
    args: argparse.Namespace,
    slice_path: Path,
    out: Path,
    log_dir: Path | None,
    one: str | None = None,
) -> list[str]:
    """routing_compare's command line for ``cell``; ``one``: that router's one run only."""
    routers, runs = (one, 1) if one else (args.routers, args.runs)
    cmd = [sys.executable, str(COMPARE), "--trace", str(slice_path),
           "--max-requests", str(cell.requests), "--speedup", f"{SPEEDUP:g}",
           "--rate-scale", f"{cell.rate:g}", "--routers", routers,
           "--runs", str(runs), "--out", str(out)]  # fmt: skip
    if log_dir is not None:
        cmd += ["--log-dir", str(log_dir)]
    return [*cmd, "--old-rules"] if args.old_rules else cmd


# -- state ------------------------------------------------------------------------------


def state_key(cell: Cell, rules: str) -> str:
    return f"{cell.key}|{rules}"


def load_state(path: str | None, settings: dict[str, Any]) -> dict[str, Any]:
    """The state file's content (a new one when absent); ``ValueError`` when it was made
    with other settings."""
    fresh: dict[str, Any] = {"version": STATE_VERSION, "settings": settings, "cells": {}}
    if not path or not Path(path).exists():
        return fresh
    state: dict[str, Any] = json.loads(Path(path).read_text(encoding="utf-8"))
    if state.get("settings") != settings:
        raise ValueError(
            f"{path} holds cells run with {state.get('settings')}, not {settings}: "
            "use another --state file"
        )
    return state


def save_state(path: str | None, state: dict[str, Any]) -> None:
    """Write ``state`` whole, replacing the old file at once (an interrupted write leaves
    the previous one)."""
    if not path:
        return
    tmp = Path(f"{path}.tmp")
    tmp.write_text(json.dumps(state, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def is_done(state: dict[str, Any], cell: Cell, rules: str) -> bool:
    entry = state["cells"].get(state_key(cell, rules))
    return bool(entry and entry.get("complete"))


def pending(state: dict[str, Any], cells: list[Cell], rules: str) -> list[Cell]:
    return [c for c in cells if not is_done(state, c, rules)]


# -- running ----------------------------------------------------------------------------


def cell_ceiling(slice_path: Path, cell: Cell, doc: dict[str, Any]) -> dict[str, Any]:
    """The ceiling of the replayed slice with the profile and SLO of the run's engines."""
    from _goodput_ceiling import ceiling_of, slice_requests

    from services.common.bench.traces import load_trace

    fleet, work = doc.get("fleet") or {}, doc.get("workload") or {}
    reqs = slice_requests(load_trace(str(slice_path)), 0, cell.requests,
                          cell.rate * SPEEDUP, BLOCK_SIZE)  # fmt: skip
    out = ceiling_of(
        reqs, engine_profile=str(fleet["profile"]),
        stream_interval=int(fleet.get("stream_interval", 16)), block_size=BLOCK_SIZE,
        slo_ttft_ms=float(work.get("slo_ttft_ms", 2000.0)),
    )  # fmt: skip
    return {**out, "engine_profile": fleet["profile"]}


def merge_runs(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """One routing_compare document from several one-run documents of the same cell: their
    results numbered per router in the given order, the per-router means and ranges over
    them, the rest from the first (the fleet and workload are the same in all)."""
    from _compare_rules import per_router

    results: list[dict[str, Any]] = []
    seen: dict[str, int] = {}
    for d in docs:
        for r in d.get("results", []):
            k = seen[r["router"]] = seen.get(r["router"], -1) + 1
            results.append({**r, "run": k})
    return {**docs[0], "runs": max(seen.values(), default=0) + 1, "results": results,
            "per_router": per_router(results), "parallel_runs": len(docs)}  # fmt: skip


def _compare(
    cell: Cell, args: argparse.Namespace, slice_path: Path, tmp: Path, log_dir: Path | None
) -> tuple[int, dict[str, Any] | None]:
    """routing_compare over ``cell``: one child, or with ``--parallel`` one per router and
    run, all at once. The exit code (the worst) and the document (None: no JSON)."""
    if not args.parallel:
        out = tmp / "compare.json"
        cmd = compare_argv(cell, args, slice_path, out, log_dir)
        print(f"[{cell.key} {rules_of(args)}] {shlex.join(cmd)}", file=sys.stderr, flush=True)
        code = run_child(cmd, cwd=ROOT, stdout=subprocess.DEVNULL)
        return code, json.loads(out.read_text(encoding="utf-8")) if out.exists() else None
    routers = routers_of(args)
    jobs = [(r, k) for k in range(args.runs) for r in routers]  # interleaved order
    barrier = f"{tmp / 'started'}:{len(jobs)}"  # every fleet up before any bench starts
    outs, procs = [], []
    try:
        for r, k in jobs:
            name = f"{r.replace(':', '_')}-{k}"
            out = tmp / f"compare-{name}.json"
            sub = None if log_dir is None else log_dir / name
            cmd = [*compare_argv(cell, args, slice_path, out, sub, one=r),
                   "--start-barrier", barrier]  # fmt: skip
            print(f"[{cell.key} {rules_of(args)}] {shlex.join(cmd)}", file=sys.stderr, flush=True)
            outs.append(out)
            procs.append(subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL))
        codes = [p.wait() for p in procs]
    finally:
        for p in procs:  # unwound: each child stops its own fleet
            if p.poll() is None:
                p.terminate()
        for p in procs:
            p.wait()
    docs = [json.loads(o.read_text(encoding="utf-8")) for o in outs if o.exists()]
    return max(codes), merge_runs(docs) if docs else None


def run_cell(cell: Cell, args: argparse.Namespace) -> dict[str, Any]:
    """One routing_compare run of ``cell``: the state entry (its JSON, the ceiling)."""
    rules = rules_of(args)
    started, load = time.time(), os.getloadavg()
    log_dir = None
    if args.log_dir:
        log_dir = Path(args.log_dir) / state_key(cell, rules).replace(":", "_").replace("|", "-")
    with tempfile.TemporaryDirectory(prefix="goodput-live-") as tmp:
        slice_path = write_slice(trace_of(cell, args), cell, Path(tmp) / "slice.jsonl")
        code, got = _compare(cell, args, slice_path, Path(tmp), log_dir)
        if got is None:
            doc: dict[str, Any] = {"error": f"routing_compare exited {code} without a JSON"}
            ceiling: dict[str, Any] = {}
        else:
            doc = got
            ceiling = cell_ceiling(slice_path, cell, doc)
    routers = routers_of(args)
    report = cell_report(cell, rules, doc, ceiling, routers, args.runs)
    return {
        "cell": cell.key, "rules": rules, "complete": report["complete"],
        "trace": str(trace_of(cell, args)),
        "started_unix": round(started), "wall_s": round(time.time() - started, 1),
        "load_average_before": [round(x, 2) for x in load], "exit_code": code,
        "parallel": bool(args.parallel),
        "ceiling": ceiling, "compare": doc,
    }  # fmt: skip


def build_report(
    args: argparse.Namespace, cells: list[Cell], state: dict[str, Any]
) -> dict[str, Any]:
    """Every requested cell found in the state, under either rule set, and the summary."""
    routers = routers_of(args)
    reports = []
    for cell in cells:
        for rules in ("new", "old"):
            entry = state["cells"].get(state_key(cell, rules))
            if entry is None:
                continue
            rep = cell_report(cell, rules, entry["compare"], entry["ceiling"], routers, args.runs)
            rep["load_average_before"] = entry.get("load_average_before")
            rep["wall_s"] = entry.get("wall_s")
            reports.append(rep)
    wanted = [(c.key, rules_of(args)) for c in cells]
    return {
        "benchmark": "goodput_live",
        "command": command_line(),
        "settings": state["settings"],
        "cells": reports,
        "summary": summary(reports, wanted),
        "state": args.state,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    unwind_on_sigterm()  # the routing_compare child is then stopped, and stops its fleet
    try:
        cells = parse_cells(args.cells, args.preset)
        if not cells or args.runs < 1:
            raise ValueError("give --cells or --preset, and --runs >= 1")
        state = load_state(args.state, settings_of(args))
        check_slices(cells, args)
    except (ValueError, OSError) as err:
        print(err, file=sys.stderr)
        return 2
    rules = rules_of(args)
    todo = [] if args.report else pending(state, cells, rules)
    if args.plan:
        for c in todo:
            print(shlex.join(compare_argv(c, args, Path(f"<slice of {c.key}>"),
                                          Path("<tmp>/compare.json"), None)))  # fmt: skip
        print(f"{len(todo)} of {len(cells)} cells left ({rules} rules)", file=sys.stderr)
        return 0
    for i, cell in enumerate(todo):
        print(f"cell {i + 1}/{len(todo)}: {cell.key} ({rules} rules)", file=sys.stderr)
        state["cells"][state_key(cell, rules)] = run_cell(cell, args)
        save_state(args.state, state)
    report = build_report(args, cells, state)
    text = json.dumps(report, indent=2)
    if args.out:
        Path(args.out).write_text(text + "\n", encoding="utf-8")
    print(markdown(report["cells"], report["summary"]) if args.markdown else text)
    return 0 if not report["summary"]["missing"] else 1


if __name__ == "__main__":
    sys.exit(main())
