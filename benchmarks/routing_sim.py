"""Virtual-time routing simulator: scheduler profiles on simulated engines, in seconds.

A TUNING TOOL for the scheduler's routing profiles over ``tideserve sim``'s simulator
(:mod:`services.sim`: the engine simulator's pure :class:`services.common.engine_core.core.EngineCore`
per engine, same perf profile and KV size as ``routing_compare.py``'s fleet, under the
scheduler's pure :class:`services.common.scheduling.GatewayCore` on a deterministic event
queue): several profiles on one slice, each on a fresh fleet, with routing diagnostics and
where the TTFT goes, so a profile change can be compared in seconds instead of a 6-minute
live run. No processes, no sockets, no wall clock: the same inputs give the same JSON.

Its options map onto ``tideserve sim``'s: ``--pd --prefill N --decode M`` = ``--prefill N
--decode M``; ``--perf-profile`` = ``--engine-profile``; ``--profiles a,b`` = one
``--profile`` run each; ``--shaper-*`` and ``--shaped-profiles`` set the gateway's dispatch
order (``SimConfig.shaper_*``; baselines run without it); defaults differ (here
``--rate-scale 2.5``, 400 requests, SLOs 2000/100 ms).

What it models from the live ``routing_compare.py`` setup (``tideserve gateway --endpoints``
in front of ``tideserve engine`` processes, ``tideserve bench --trace-time``):

* prompts: the bench's synthesis (``PromptSynthesizer``, seed 0) of each Mooncake request,
  sent as a chat message, so the gateway and the engine both see ``"user: " + prompt``;
  ``max_tokens`` = the trace's output length (``ignore_eos``); arrivals = trace time /
  ``--rate-scale``.
* the gateway's view of load: by default what the live gateway has without Redis — a
  ``/metrics`` scrape every ``--scrape-interval-ms`` (phase-shifted per engine) carrying only
  running / waiting / KV usage, delivered ``--scrape-lag-ms`` after the engine's state was
  read; plus the gateway's own reservations (a pick counts on its instances until released
  and its uncached prompt tokens count as pending prefill until the first token), exactly as
  :class:`services.common.scheduling.fleet.Fleet` merges them. ``--load-source stream``
  instead reports the engines' full load snapshot (pending prefill, tokens in flight) as the
  Redis load stream would.
* first token: the engines coalesce ``--stream-interval`` tokens per SSE chunk (16 in
  ``routing_compare.py``), so the client's first token and the gateway's ``first_token``
  (its pending-prefill reservation ends) are at the step that produced the 16th token (or the
  last); TPOT = (last - first) / (tokens - 1) as the bench computes it; ``release`` at the
  last token.
* P/D (``--pd``): SGLang-style disaggregation as the simulator engines do it — the prefill
  engine computes the prompt and holds its KV; when it finishes, the decode engine receives
  the request with the modelled KV transfer time and emits the first token when the KV has
  arrived; a non-disaggregated pick runs entirely on the decode engine.

Not modelled: HTTP/CPU overheads (the live engines keep the modelled step schedule within
their ``catch_up_ms``, :mod:`services.engine.pacing`, but a loaded machine still delays
tokens), retries/failures, machine noise. Use the figures to rank profiles, and confirm with
``routing_compare.py``; ``--step-traces`` and ``benchmarks/placement_replay.py`` compare the
two engine by engine.

    .venv/bin/python benchmarks/routing_sim.py --max-requests 400 --rate-scale 2.5 \\
        --profiles default,cache_aware,round_robin,least_load

Prints one JSON object (also written to ``--out``): per profile the TTFT/TPOT distributions
(ms of modelled time), goodput under the SLOs, cache hit ratio, requests per engine and
routing diagnostics (how often the pick kept the best routed prefix, and why not).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import _sim_args as sim_args  # noqa: E402
from _sim_stats import by_turn, dist, time_split  # noqa: E402

from services.common.bench.plot import ensure_available, write_cdf_plot  # noqa: E402
from services.common.bench.stats import infinite_cache_hit_ratio  # noqa: E402
from services.common.bench.traces import Trace, TraceRequest, load_trace  # noqa: E402
from services.common.engine_core.steptrace import StepTrace  # noqa: E402
from services.sim import SimConfig, Simulation  # noqa: E402
from services.sim.records import SimRequest  # noqa: E402
from services.sim.results import sim_section  # noqa: E402
from services.sim.run import SimRun  # noqa: E402

TRACE = ROOT.parent / "shared" / "traces" / "mooncake_conversation_trace.jsonl"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return sim_args.parse_args(argv, __doc__ or "", TRACE)


def sim_config(a: argparse.Namespace, profile: str) -> SimConfig:
    """``tideserve sim``'s config for one profile of a routing_sim run."""
    shaped = profile in a.shaped_profiles.split(",")
    return SimConfig(
        engines=a.engines,
        prefill=a.prefill if a.pd else 0,
        decode=a.decode if a.pd else 0,
        profile=profile,
        profiles_file=a.profiles_file,
        engine_profile=a.perf_profile,
        seed=a.seed,
        rate_scale=a.rate_scale,
        kv_blocks=a.kv_blocks,
        block_size=a.block_size,
        stream_interval=a.stream_interval,
        load_source=a.load_source,
        precise=a.precise,
        scrape_interval_ms=a.scrape_interval_ms,
        scrape_lag_ms=a.scrape_lag_ms,
        slo_ttft_ms=a.slo_ttft_ms,
        slo_tpot_ms=a.slo_tpot_ms,
        decode_can_prefill=a.decode_can_prefill,
        shaper_hold_ms=a.shaper_hold_ms if shaped else 0.0,
        shaper_age_weight=a.shaper_age_weight,
        shaper_order=a.shaper_order,
    )


class Sim:
    """One profile on one fresh fleet. ``run`` returns the summary dict."""

    def __init__(self, args: argparse.Namespace, profile: str, trace: Sequence[TraceRequest]):
        self.a = args
        self.profile = profile
        self.sim = Simulation(
            sim_config(args, profile), Trace(args.trace, "mooncake", tuple(trace))
        )
        self.ttft_values: list[float] = []
        if args.step_traces:  # the live engines' --step-trace format, one file per engine
            d = Path(args.step_traces)
            d.mkdir(parents=True, exist_ok=True)
            for i, inst in enumerate(self.sim.engines):
                inst.trace = StepTrace(d / f"{profile}-engine-{i}.steps.jsonl")

    def run(self) -> dict[str, Any]:
        return self.summary(self.sim.run())

    def summary(self, run: SimRun) -> dict[str, Any]:
        a = self.a
        perf = self.sim.perf
        done = [r for r in run.requests if r.last is not None and r.first is not None]
        # (ttft, tpot or None) per completed request, as the bench computes them.
        lat = [_latency(r) for r in done]
        ttft = sorted(t for t, _ in lat)
        self.ttft_values = ttft  # for --plot; not in the JSON
        tpot = sorted(p for _, p in lat if p is not None)
        miss = {"ttft": 0, "tpot": 0, "both": 0, "ttft_infeasible_idle": 0}
        good = 0
        for r, (t, p) in zip(done, lat, strict=True):
            t_bad = t > a.slo_ttft_ms
            p_bad = p is not None and p > a.slo_tpot_ms
            good += not (t_bad or p_bad)
            if t_bad and p_bad:
                miss["both"] += 1
            elif t_bad:
                miss["ttft"] += 1
            elif p_bad:
                miss["tpot"] += 1
            if t_bad and perf.prefill_ms(r.prompt_tokens - r.cached, r.cached) > a.slo_ttft_ms:
                miss["ttft_infeasible_idle"] += 1
        start = min(r.arrival for r in run.requests)
        end = max(float(r.last or 0.0) for r in done)
        dur_s = (end - start) / 1000.0
        g = run.diag
        sim = sim_section(run)
        routing = sim["routing"]
        routing["engine_cached_tokens"] = sum(r.cached for r in done)
        routing["prompt_tokens"] = sum(r.prompt_tokens for r in done)
        return {
            "profile": self.profile,
            "completed": len(done),
            "shed": sum(r.error == "shed" for r in run.requests),
            # refused by the engine (prompt + max_tokens past its context or KV capacity)
            "failed": sum((r.error or "").startswith("engine refused") for r in run.requests),
            "duration_s": round(dur_s, 3),
            "ttft_ms": dist(ttft),
            "tpot_ms": dist(tpot),
            "goodput_rps": round(good / dur_s, 4) if dur_s > 0 else None,
            "slo_attainment": round(good / len(run.requests), 4),
            "slo_misses": miss,
            "cache_hit_ratio": round(
                sum(r.cached for r in done) / max(1, sum(r.prompt_tokens for r in done)), 4
            ),
            "requests_per_engine": sim["requests_per_instance"],
            "routing": routing,
            "time_split_ms": time_split(done, perf, g, dur_s, len(run.engines)),
            "by_turn": by_turn(done, a.slo_ttft_ms, a.slo_tpot_ms),
            "shaper": {
                "hold_above_ms": self.sim.cfg.shaper_hold_ms,
                "mean_held_ms": round(g.held_ms / max(1, g.picks), 1),
            },
            "sim_events": run.events,
        }


def _latency(r: SimRequest) -> tuple[float, float | None]:
    first, last = float(r.first or 0.0), float(r.last or 0.0)
    return first - r.arrival, (last - first) / (r.out - 1) if r.out > 1 else None


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    trace = load_trace(a.trace).requests[a.offset :][: a.max_requests]
    if not trace:
        print("no requests in the trace slice", file=sys.stderr)
        return 1
    out: dict[str, Any] = {
        "tool": "routing_sim (tuning tool, virtual time)",
        "args": vars(a),
        "infinite_cache_hit_ratio": infinite_cache_hit_ratio(trace, 512),
        "results": [],
    }
    if a.plot:
        ensure_available()  # before the runs, not after them
    ttfts: dict[str, list[float]] = {}
    for name in [p.strip() for p in a.profiles.split(",") if p.strip()]:
        sim = Sim(a, name, trace)
        res = sim.run()
        ttfts[name] = sim.ttft_values
        out["results"].append(res)
        print(json.dumps(res), file=sys.stderr, flush=True)
    if a.plot:
        write_cdf_plot(
            a.plot,
            ttfts,
            xlabel="TTFT (ms, modelled time)",
            title=f"TTFT, routing_sim: {Path(a.trace).stem} [{a.offset}:+{len(trace)}] "
            f"at {a.rate_scale:g}x",
        )
    text = json.dumps(out, indent=2)
    print(text)
    if a.out:
        Path(a.out).write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
