"""Virtual-time routing simulator: scheduler profiles on simulated engines, in seconds.

A TUNING TOOL for the scheduler's routing profiles (issue 5), not the product's discrete-event
simulator (the later ``tideserve sim``). It drives the engine simulator's pure
:class:`services.engine.core.EngineCore` (one per engine, same perf profile and KV size as
``routing_compare.py``'s fleet) with the scheduler's pure
:class:`services.scheduler.core.GatewayCore` on a deterministic event queue, so a profile
change can be compared on a trace slice in seconds instead of a 6-minute live run. No
processes, no sockets, no wall clock: the same inputs give the same JSON.

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
  :class:`services.scheduler.core.fleet.Fleet` merges them. ``--load-source stream``
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
import heapq
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import _sim_args as sim_args  # noqa: E402
from _sim_prompts import Prompts  # noqa: E402
from _sim_stats import Diag, by_turn, dist, time_split  # noqa: E402

from services.bench.plot import ensure_available, write_cdf_plot  # noqa: E402
from services.bench.stats import infinite_cache_hit_ratio  # noqa: E402
from services.bench.traces import TraceRequest, load_trace  # noqa: E402
from services.common.perfmodel import get_profile  # noqa: E402
from services.common.tokens import block_hashes  # noqa: E402
from services.engine.core import (  # noqa: E402
    AdmissionError,
    CoreConfig,
    EngineCore,
    EngineRole,
    Request,
)
from services.engine.kvcache import KVCache  # noqa: E402
from services.engine.steptrace import StepTrace  # noqa: E402
from services.scheduler.admission.shaper import DispatchShaper, ShaperConfig  # noqa: E402
from services.scheduler.core import EndpointSpec, GatewayCore, LoadReport, build_core  # noqa: E402
from services.scheduler.routing.plugins.prefix import ApproxPrefix  # noqa: E402
from services.scheduler.routing.types import Pick, PrefixMatch, RequestView, Shed  # noqa: E402

TRACE = ROOT.parent / "shared" / "traces" / "mooncake_conversation_trace.jsonl"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return sim_args.parse_args(argv, __doc__ or "", TRACE)


@dataclass
class _Req:
    rid: str
    arrival: float
    prompt: tuple[int, ...]
    hashes: tuple[int, ...]
    out: int
    view: RequestView
    pick: Pick | None = None
    first: float | None = None
    last: float | None = None
    cached: int = 0
    prompt_tokens: int = 0
    ntok: int = 0
    prefilled_at: float | None = None  # the engine's first token (end of the prefill)


class Sim:
    """One profile on one fresh fleet. ``run`` returns the summary dict."""

    def __init__(self, args: argparse.Namespace, profile: str, trace: Sequence[TraceRequest]):
        self.a = args
        self.profile = profile
        self.trace = trace
        perf = get_profile(args.perf_profile)
        self.perf = perf
        if args.pd:
            roles = [EngineRole.PREFILL] * args.prefill + [EngineRole.DECODE] * args.decode
        else:
            roles = [EngineRole.AGGREGATED] * args.engines
        self.cores: dict[str, EngineCore] = {}
        specs = []
        for i, role in enumerate(roles):
            iid = f"{role.value}-{i}"
            self.cores[iid] = EngineCore(
                CoreConfig(role=role), perf, KVCache(args.kv_blocks, args.block_size)
            )
            gw_role = {"aggregated": "worker", "prefill": "prefill", "decode": "decode"}
            specs.append(EndpointSpec(iid, f"http://{iid}", role=gw_role[role.value]))  # type: ignore[arg-type]
        self.gw: GatewayCore = build_core(
            specs,
            profiles=Path(args.profiles_file) if args.profiles_file else None,
            seed=args.seed,
            block_size=args.block_size,
            perf_profile=args.perf_profile,
            decode_can_prefill=args.decode_can_prefill,
        )
        self.ev: list[tuple[float, int, str, Any]] = []
        self.seq = 0
        self.busy = dict.fromkeys(self.cores, False)
        self.wake_at: dict[str, float] = {}
        self.reqs: dict[str, _Req] = {}
        self.shed = 0
        self.failed = 0
        self.diag = Diag()
        self.ttft_values: list[float] = []
        shaped = profile in args.shaped_profiles.split(",")
        self.shaper = DispatchShaper(
            ShaperConfig(
                args.shaper_hold_ms if shaped else 0.0, args.shaper_age_weight, args.shaper_order
            )
        )
        self.held_ms = 0.0  # total time requests waited in the shaper
        self.traces: dict[str, StepTrace] = {}
        if args.step_traces:  # the live engines' --step-trace format, one file per engine
            d = Path(args.step_traces)
            d.mkdir(parents=True, exist_ok=True)
            for i, iid in enumerate(self.cores):
                self.traces[iid] = StepTrace(d / f"{profile}-engine-{i}.steps.jsonl")
        prof = self.gw.scheduler.profiles[profile]
        self.approx = next((p for p in prof.preparers if isinstance(p, ApproxPrefix)), None)

    # -- events ---------------------------------------------------------------------------
    def push(self, t: float, kind: str, payload: Any) -> None:
        heapq.heappush(self.ev, (t, self.seq, kind, payload))
        self.seq += 1

    def kick(self, iid: str, now: float) -> None:
        if self.busy[iid]:
            return
        core = self.cores[iid]
        res = core.step(now)
        tr = self.traces.get(iid)
        if res is None:
            w = core.next_wakeup(now)
            if w is not None and w > now and self.wake_at.get(iid) != w:
                self.wake_at[iid] = w
                self.push(w, "wake", iid)
            return
        self.busy[iid] = True
        if tr is not None:
            tr.step(now, res, core.num_running, core.num_waiting)
        self.push(now + res.duration_ms, "done", (iid, res))

    def report(self, iid: str, now: float) -> LoadReport:
        c = self.cores[iid]
        if self.a.load_source == "stream":
            return LoadReport(
                running=c.num_running,
                waiting=c.num_waiting,
                tokens_in_flight=c.tokens_in_flight(),
                pending_prefill_tokens=c.pending_prefill_tokens(),
                kv_usage=c.cache.usage,
            )
        return LoadReport(running=c.num_running, waiting=c.num_waiting, kv_usage=c.cache.usage)

    # -- the run --------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        a = self.a
        prompts = Prompts(512)
        t0 = self.trace[0].arrival_s
        for k, r in enumerate(self.trace):
            self.push((r.arrival_s - t0) * 1000.0 / a.rate_scale, "arrive", k)
        n_eng = len(self.cores)
        for j, iid in enumerate(self.cores):  # phase-shifted scrapes
            self.push(a.scrape_interval_ms * j / n_eng, "scrape", iid)
        pending = len(self.trace)
        self._prompts = prompts
        started = time.monotonic()
        while self.ev and pending:
            now, _, kind, p = heapq.heappop(self.ev)
            if kind == "arrive":
                pending -= self.arrive(p, now)
            elif kind == "scrape":
                self.push(now + a.scrape_lag_ms, "load", (p, self.report(p, now)))
                self.push(now + a.scrape_interval_ms, "scrape", p)
            elif kind == "load":
                self.gw.fleet.report_load(p[0], p[1], now / 1000.0, source=a.load_source)
            elif kind == "shape":
                pending -= self.dispatch(self.shaper.release(p, now / 1000.0), now)
                self.arm(p)
            elif kind == "wake":
                self.wake_at.pop(p, None)
                self.kick(p, now)
            else:
                pending -= self.done(p[0], p[1], now)
        for tr in self.traces.values():
            tr.close()
        return self.summary(time.monotonic() - started)

    def arrive(self, k: int, now: float) -> int:
        """Route request ``k``; 1 when it is finished at once (shed), else 0."""
        r = self.trace[k]
        toks = self._prompts.tokens(r)
        rid = f"r{k}"
        hashes = tuple(block_hashes(toks, self.a.block_size))
        view = RequestView(
            rid, len(toks), hashes, self.a.block_size, max(1, r.output_length),
            ttft_slo_ms=self.a.slo_ttft_ms, prefix_matches=self.precise(hashes),
        )  # fmt: skip
        req = _Req(rid, now, toks, hashes, max(1, r.output_length), view)
        self.reqs[rid] = req
        match = self.approx.index.match(hashes, now / 1000.0) if self.approx else {}
        d = self.gw.pick(view, now / 1000.0, rid, self.profile)
        if isinstance(d, Shed):  # refused with 429, as the live gateway would: not good
            self.shed += 1
            return 1
        if not isinstance(d, Pick):
            raise RuntimeError(f"{rid}: {d}")
        req.pick = d
        self.note(match, d)
        iid = (d.prefill or d.decode).endpoint.instance_id
        deadline = (now + self.a.slo_ttft_ms) / 1000.0
        if not self.shaper.offer(rid, iid, d.predicted_prefill_ms, now / 1000.0, 0, deadline):
            self.arm(iid)
            return 0
        return self.dispatch([rid], now)

    def dispatch(self, rids: list[str], now: float) -> int:
        """Send picked requests to their engines; how many ended at once (refused)."""
        ended = 0
        for rid in rids:
            req = self.reqs[rid]
            d = req.pick
            assert d is not None
            self.held_ms += now - req.arrival
            iid = (d.prefill or d.decode).endpoint.instance_id
            try:  # the live engine answers 400 here (and the bench counts it failed)
                self.cores[iid].submit(
                    Request(rid, req.prompt, req.out, hold_kv=d.prefill is not None), now
                )
                if iid in self.traces:
                    self.traces[iid].submit(rid, now, len(req.prompt), req.out, 0.0)
            except AdmissionError:
                self.failed += 1
                self.gw.release(rid)
                ended += 1
                ended += self.dispatch(self.shaper.done(rid, iid, now / 1000.0), now)
                continue
            self.kick(iid, now)
        return ended

    def arm(self, iid: str) -> None:
        """A timer for when the shaper's prediction lets a waiting request of ``iid`` go."""
        at = self.shaper.next_release_at(iid)
        if at is not None:
            self.push(at * 1000.0 + 1e-6, "shape", iid)

    def precise(self, hashes: tuple[int, ...]) -> dict[str, PrefixMatch] | None:
        """With ``--precise``: each engine's resident prefix of ``hashes`` (None otherwise)."""
        if not self.a.precise:
            return None
        chain = list(hashes)
        out: dict[str, PrefixMatch] = {}
        for iid, c in self.cores.items():
            n = c.cache.match(chain)
            if n:
                out[iid] = PrefixMatch(n, {"gpu": n})
        return out

    def note(self, match: dict[str, int], d: Pick) -> None:
        g = self.diag
        g.picks += 1
        g.disaggregated += d.prefill is not None
        g.predicted_cached += d.predicted_cached_tokens
        target = (d.prefill or d.decode).endpoint.instance_id
        pool = [
            i for i in match if (self.gw.fleet.spec(i).role == "prefill") == (d.prefill is not None)
        ]
        best = max((match[i] for i in pool), default=0)
        if best <= 0:
            return
        g.with_prefix += 1
        g.best_blocks += best
        got = match.get(target, 0)
        if got >= best:
            g.kept_best += 1
            return
        g.lost_blocks += best - got
        # Which scorer outweighed the prefix: the chosen instance's score detail.
        choice = d.prefill or d.decode
        top = max(choice.scores, key=lambda s: s[1] * s[2], default=("?", 0.0, 0.0))
        g.reasons[top[0]] = g.reasons.get(top[0], 0) + 1

    def done(self, iid: str, res: Any, now: float) -> int:
        self.busy[iid] = False
        core = self.cores[iid]
        if iid in self.traces:
            self.traces[iid].outputs(now, res.outputs)
        finished = 0
        prefill_role = core.config.role is EngineRole.PREFILL
        if not prefill_role and res.duration_ms > 0:
            g = self.diag
            g.steps += 1
            g.step_ms += res.duration_ms
            g.decode_seqs += res.decode_tokens
            if res.prefill_tokens:
                g.mixed_steps += 1
                g.mixed_ms += res.duration_ms
        for o in res.outputs:
            req = self.reqs[o.rid]
            if prefill_role:
                # The prefill finished: hand the KV to the decode engine (SGLang bootstrap).
                assert req.pick is not None
                diid = req.pick.decode.endpoint.instance_id
                xfer = self.perf.transfer_ms(o.prompt_tokens)
                core.hand_off(o.rid, now + xfer)
                self.cores[diid].submit(
                    Request(
                        o.rid, req.prompt, req.out,
                        kv_transfer_ms=xfer, peer_cached_tokens=o.cached_tokens,
                    ),
                    now,
                )  # fmt: skip
                self.kick(diid, now)
                self.push(now + xfer, "wake", iid)  # the held KV frees then
                continue
            if req.prefilled_at is None:
                req.prefilled_at = now
            req.ntok += len(o.tokens)
            # The engine's first SSE chunk carries --stream-interval tokens (or the last):
            # that is the client's first token and the gateway's first byte.
            if req.first is None and (req.ntok >= self.a.stream_interval or o.finished):
                req.first = now
                req.cached = o.cached_tokens
                req.prompt_tokens = o.prompt_tokens
                self.gw.first_token(o.rid)
                assert req.pick is not None
                tgt = (req.pick.prefill or req.pick.decode).endpoint.instance_id
                finished += self.dispatch(self.shaper.first_byte(o.rid, tgt, now / 1000.0), now)
            if o.finished:
                req.last = now
                self.gw.release(o.rid)
                finished += 1
        self.kick(iid, now)
        return finished

    # -- summary --------------------------------------------------------------------------
    def summary(self, cpu_s: float) -> dict[str, Any]:
        a = self.a
        done = [r for r in self.reqs.values() if r.last is not None and r.first is not None]
        # (ttft, tpot or None) per completed request, as the bench computes them.
        lat: list[tuple[float, float | None]] = []
        for r in done:
            first, last = float(r.first or 0.0), float(r.last or 0.0)
            lat.append((first - r.arrival, (last - first) / (r.out - 1) if r.out > 1 else None))
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
            if t_bad and self.perf.prefill_ms(r.prompt_tokens - r.cached, r.cached) > a.slo_ttft_ms:
                miss["ttft_infeasible_idle"] += 1
        start = min(r.arrival for r in self.reqs.values())
        end = max(float(r.last or 0.0) for r in done)
        dur_s = (end - start) / 1000.0
        g = self.diag
        spread: dict[str, int] = {}
        for r in self.reqs.values():
            if r.pick is not None:
                tgt = (r.pick.prefill or r.pick.decode).endpoint.instance_id
                spread[tgt] = spread.get(tgt, 0) + 1
        return {
            "profile": self.profile,
            "completed": len(done),
            "shed": self.shed,
            # refused by the engine (prompt + max_tokens past its context or KV capacity)
            "failed": self.failed,
            "duration_s": round(dur_s, 3),
            "ttft_ms": dist(ttft),
            "tpot_ms": dist(tpot),
            "goodput_rps": round(good / dur_s, 4) if dur_s > 0 else None,
            "slo_attainment": round(good / len(self.reqs), 4),
            "slo_misses": miss,
            "cache_hit_ratio": round(
                sum(r.cached for r in done) / max(1, sum(r.prompt_tokens for r in done)), 4
            ),
            "requests_per_engine": [spread.get(i, 0) for i in self.cores],
            "routing": {
                "picks": g.picks,
                "disaggregated": g.disaggregated,
                "with_routed_prefix": g.with_prefix,
                "kept_best_prefix": g.kept_best,
                "lost_prefix_blocks": g.lost_blocks,
                # What the engines reported cached vs what routing expected (tokens).
                "best_routed_prefix_tokens": g.best_blocks * a.block_size,
                "predicted_cached_tokens": g.predicted_cached,
                "engine_cached_tokens": sum(r.cached for r in done),
                "prompt_tokens": sum(r.prompt_tokens for r in done),
                "lost_to_top_scorer": g.reasons,
            },
            "time_split_ms": time_split(done, self.perf, self.diag, dur_s, len(self.cores)),
            "by_turn": by_turn(done, a.slo_ttft_ms, a.slo_tpot_ms),
            "shaper": {
                "hold_above_ms": self.shaper.config.hold_above_ms,
                "mean_held_ms": round(self.held_ms / max(1, g.picks), 1),
            },
            "sim_cpu_s": round(cpu_s, 2),
        }


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
