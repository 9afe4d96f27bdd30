"""CPU per request of two gateway trees, A/B, interleaved.

A change of a few % of the gateway's CPU per request is below what one run per side can
show on a shared machine (back-to-back ``gateway_profile.py`` runs of the same tree differ
by ±15 %). Here both gateways run at once, one ``tideserve gateway`` from each source tree
(``--a`` and ``--b``: directories holding ``services/``, e.g. ``git archive`` exports),
in front of the same canned nginx upstream as ``gateway_overhead.py``, and ``wrk``
(closed loop, non-streaming 128-token ``/v1/completions``) drives them in turns: ``--rounds``
rounds of ``--seconds`` each, the order alternating per round, so the machine's load of
the moment hits both sides alike. Per turn: the gateway process's CPU (user + system, from
``psutil``) over the requests wrk completed. Prints the per-turn figures and their medians.

    .venv/bin/python benchmarks/gateway_ab.py --a /tmp/before --b . --rounds 12
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent))

import psutil
from _canned_upstream import start_canned_upstream
from _harness import ProcGroup, command_line, emit_json, free_port, machine, wait_http
from gateway_overhead import wrk_max


def gateway_cmd(tree: Path, port: int, upstream: str, extra: Sequence[str] = ()) -> list[str]:
    """``tideserve gateway`` importing ``services`` from ``tree`` (not this checkout)."""
    boot = (f"import sys; sys.path.insert(0, {str(tree.resolve())!r}); "
            "from services.cli import main; sys.exit(main())")  # fmt: skip
    return [sys.executable, "-c", boot, "gateway", "--host", "127.0.0.1", "--port", str(port),
            "--endpoints", upstream, "--log-level", "WARNING", *extra]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--a", required=True, help="source tree A (the baseline)")
    p.add_argument("--b", required=True, help="source tree B")
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--seconds", type=float, default=4.0, help="wrk duration per turn")
    p.add_argument("--connections", type=int, default=16)
    p.add_argument("--a-args", default="", help="extra gateway flags of side A (shell-split)")
    p.add_argument("--b-args", default="", help="extra gateway flags of side B (shell-split)")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="tideserve-gwab-"))
    group = ProcGroup(workdir)
    wrk_args = argparse.Namespace(prompt_words=128, wrk_connections=args.connections,
                                  wrk_duration=args.seconds)  # fmt: skip
    turns: dict[str, list[dict[str, Any]]] = {"a": [], "b": []}
    try:
        upstream = start_canned_upstream(group, workdir)
        ports, procs = {}, {}
        for side in ("a", "b"):
            ports[side] = free_port()
            tree = Path(getattr(args, side))
            extra = shlex.split(getattr(args, f"{side}_args"))
            child = group.start(f"gateway-{side}", gateway_cmd(tree, ports[side], upstream, extra))
            procs[side] = psutil.Process(child.proc.pid)
        for side in ("a", "b"):
            wait_http(f"http://127.0.0.1:{ports[side]}/v1/models", group, 60.0)
            wrk_max(ports[side], argparse.Namespace(**{**vars(wrk_args), "wrk_duration": 2}),
                    workdir, None)  # warm-up  # fmt: skip
        for r in range(args.rounds):
            for side in ("a", "b") if r % 2 == 0 else ("b", "a"):
                t0 = procs[side].cpu_times()
                res = wrk_max(ports[side], wrk_args, workdir, None)
                t1 = procs[side].cpu_times()
                cpu = (t1.user - t0.user) + (t1.system - t0.system)
                rps = res.get("requests_per_s") or 0.0
                n = rps * args.seconds
                turns[side].append({"requests_per_s": rps, "non_2xx": res["non_2xx"],
                                    "cpu_us_per_request": round(cpu / n * 1e6, 1) if n else None})  # fmt: skip
            group.check()
    finally:
        group.stop()

    def med(side: str, key: str) -> float | None:
        xs = [t[key] for t in turns[side] if t[key] is not None]
        return round(statistics.median(xs), 1) if xs else None

    summary = {
        "benchmark": "gateway_ab", "command": command_line(), "machine": machine(),
        "a": str(args.a), "b": str(args.b), "turns": turns,
        "median_cpu_us_per_request": {s: med(s, "cpu_us_per_request") for s in turns},
        "median_requests_per_s": {s: med(s, "requests_per_s") for s in turns},
    }  # fmt: skip
    emit_json(summary, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
