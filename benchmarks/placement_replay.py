"""Replay a live run's placement on the pure engine core, in virtual time.

Splits "the router placed requests differently" from "the live engines ran differently":
every request goes to the engine it went to live (from the engines' ``--step-trace``
files: ``routing_compare.py --step-traces``) at the moment it reached that engine live, and
each engine is the simulator's :class:`services.common.engine_core.core.EngineCore` with the live
fleet's profile and KV size. What differs from the live figures is then the engines' shell
(HTTP, the event loop, sleep overshoot: the traces' ``late_share`` and ``handler_ms``), not
the placement; what differs from ``routing_sim.py`` is the placement and dispatch timing.

Mapping: a live submit is matched to the trace request with the same prompt length in
tokens (the bench's prompts, as ``services.sim.inputs.Prompts`` builds them; nearly all lengths are
unique in an agentic slice). Each engine's clock starts at its own start-up, so its offset
to the trace's clock is the smallest (submit - arrival) among its requests of a unique
length: the live gateway's delay of that fastest request counts as 0. A length shared by
several requests goes to the latest of them that had arrived by then.

Figures as ``routing_sim.py`` computes them: TTFT to the first ``--stream-interval``-token
chunk, TPOT = (last - first chunk) / (tokens - 1), goodput over the SLOs.

    .venv/bin/python benchmarks/placement_replay.py --trace /tmp/weka_1201_1800.jsonl \\
        --max-requests 600 --rate-scale 1 /tmp/live/st1201/tideserve-default-engine-*.steps.jsonl
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import emit_json  # noqa: E402
from _sim_stats import dist  # noqa: E402
from step_trace_summary import read_traces  # noqa: E402

from services.common.bench.traces import TraceRequest, load_trace  # noqa: E402
from services.common.engine_core.core import CoreConfig, EngineCore, Request  # noqa: E402
from services.common.engine_core.kvcache import KVCache  # noqa: E402
from services.common.perfmodel import get_profile  # noqa: E402
from services.sim.inputs import Prompts  # noqa: E402


@dataclass(frozen=True)
class Placed:
    k: int  # index in the trace slice
    engine: int
    at_ms: float  # when it reached its engine, on the trace's clock


def place(
    submits: dict[int, list[tuple[float, int]]], arrivals: list[float], lengths: list[int]
) -> list[Placed]:
    """``submits``: engine -> [(engine-clock ms, prompt tokens)] from its trace;
    ``arrivals``/``lengths``: per trace request, arrival ms and prompt tokens."""
    by_len: dict[int, list[int]] = defaultdict(list)
    for k, n in enumerate(lengths):
        by_len[n].append(k)
    offsets: dict[int, float] = {}
    for eng, subs in submits.items():  # the clock offset, from unambiguous lengths only
        sure = [t - arrivals[by_len[n][0]] for t, n in subs if len(by_len.get(n, ())) == 1]
        if sure:
            offsets[eng] = min(sure)
    used: set[int] = set()
    out: list[Placed] = []
    for eng, subs in sorted(submits.items()):
        if eng not in offsets:
            continue
        for t, n in sorted(subs):
            at = t - offsets[eng]
            free = [k for k in by_len.get(n, []) if k not in used and arrivals[k] <= at]
            if free:
                k = max(free, key=lambda j: arrivals[j])  # the latest that had arrived
                used.add(k)
                out.append(Placed(k, eng, at))
    return sorted(out, key=lambda p: p.at_ms)


@dataclass
class _Out:
    arrival: float
    n: int
    first: float | None = None
    last: float | None = None
    got: int = 0


def replay(
    placed: list[Placed],
    prompts: list[tuple[int, ...]],
    outs: list[int],
    arrivals: list[float],
    a: argparse.Namespace,
) -> dict[str, Any]:
    perf = get_profile(a.profile)
    res: dict[int, _Out] = {}
    per_engine: dict[int, list[Placed]] = defaultdict(list)
    for p in placed:
        per_engine[p.engine].append(p)
    for _eng, subs in sorted(per_engine.items()):
        core = EngineCore(CoreConfig(), perf, KVCache(a.kv_blocks, a.block_size))
        i, now = 0, 0.0
        while i < len(subs) or core.num_running or core.num_waiting:
            if not (core.num_running or core.num_waiting) and subs[i].at_ms > now:
                now = subs[i].at_ms
            while i < len(subs) and subs[i].at_ms <= now:
                p = subs[i]
                core.submit(Request(f"r{p.k}", prompts[p.k], outs[p.k]), p.at_ms)
                res[p.k] = _Out(arrivals[p.k], outs[p.k])
                i += 1
            step = core.step(now)
            if step is None:
                if i == len(subs):
                    break  # nothing can run and nothing more arrives
                now = subs[i].at_ms
                continue
            now += step.duration_ms
            for o in step.outputs:
                r = res[int(o.rid[1:])]
                r.got += len(o.tokens)
                if r.first is None and (r.got >= a.stream_interval or o.finished):
                    r.first = now
                if o.finished:
                    r.last = now
    ttft, tpot, good = [], [], 0
    miss: dict[str, list[int]] = {"ttft": [], "tpot": [], "both": []}
    for k, r in sorted(res.items()):
        assert r.first is not None and r.last is not None
        t = r.first - r.arrival
        p = (r.last - r.first) / (r.n - 1) if r.n > 1 else None
        ttft.append(t)
        if p is not None:
            tpot.append(p)
        t_bad, p_bad = t > a.slo_ttft_ms, p is not None and p > a.slo_tpot_ms
        good += not (t_bad or p_bad)
        if t_bad or p_bad:
            miss["both" if t_bad and p_bad else "ttft" if t_bad else "tpot"].append(k)
    dur_s = (max(r.last or 0.0 for r in res.values()) - min(arrivals)) / 1000.0
    return {
        "completed": len(res),
        "ttft_ms": dist(sorted(ttft)),
        "tpot_ms": dist(sorted(tpot)),
        "goodput_rps": round(good / dur_s, 4),
        "slo_attainment": round(good / len(arrivals), 4),
        "requests_per_engine": [len(per_engine.get(e, [])) for e in range(a.engines)],
        "mean_dispatch_delay_ms": round(
            statistics.fmean(p.at_ms - arrivals[p.k] for p in placed), 1
        ),
        "slo_misses": {kind: len(ks) for kind, ks in miss.items()},
        # which trace requests missed (indices in the slice), to compare routers
        "missed": sorted(k for ks in miss.values() for k in ks),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("files", nargs="+", help="<group>-engine-<i>.steps.jsonl of one live run")
    p.add_argument("--trace", required=True, help="the Mooncake JSONL the run replayed")
    p.add_argument("--offset", type=int, default=0)
    p.add_argument("--max-requests", type=int, default=600)
    p.add_argument("--rate-scale", type=float, default=1.0)
    p.add_argument("--engines", type=int, default=8)
    p.add_argument("--profile", default="h200-llama3.1-8b")
    p.add_argument("--kv-blocks", type=int, default=16384)
    p.add_argument("--block-size", type=int, default=64)
    p.add_argument("--stream-interval", type=int, default=16)
    p.add_argument("--slo-ttft-ms", type=float, default=2000.0)
    p.add_argument("--slo-tpot-ms", type=float, default=100.0)
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    trace: list[TraceRequest] = load_trace(a.trace).requests[a.offset :][: a.max_requests]
    synth = Prompts(512)
    prompts = [synth.tokens(r) for r in trace]
    t0 = trace[0].arrival_s
    arrivals = [(r.arrival_s - t0) * 1000.0 / a.rate_scale for r in trace]
    outs = [max(1, r.output_length) for r in trace]
    try:
        groups = read_traces(a.files)
    except ValueError as err:
        p.error(str(err))
    out: dict[str, Any] = {"tool": "placement_replay", "args": vars(a), "results": {}}
    for g, by_i in sorted(groups.items()):
        submits = {
            i: [(e["t"], e["prompt"]) for e in events if e["ev"] == "submit"]
            for i, events in by_i.items()
        }
        placed = place(submits, arrivals, [len(x) for x in prompts])
        r = replay(placed, prompts, outs, arrivals, a)
        r["matched"] = len(placed)
        out["results"][g] = r
    emit_json(out, a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
