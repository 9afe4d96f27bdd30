"""The simulation loop (pure: modelled time only, seeded RNG, no I/O but optional step
traces): trace arrivals → a gateway replica's pick → the engine cores' steps → first token
and release back to the gateway, on one :class:`~services.sim.events.EventQueue`.

Events: ``arrive`` (a request reaches a gateway), ``scrape`` (a gateway reads an engine's
load; delivered as ``load`` ``scrape_lag_ms`` later), ``shape`` (a held pick may go),
``wake`` (an engine has something to do again), ``done`` (an engine step ended),
``ended`` (a gateway learns a request ended, ``end_lag_ms`` after its last step, when that
is set), ``sample`` (a timeline row); ``fail``, ``detect`` and ``retry`` for an instance
failure (:mod:`services.sim.failures`). What the gateway sees of an engine is exactly what
the live gateway has: the scrape (or the load stream's snapshot) plus its own reservations.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from services.common.bench.traces import Trace
from services.common.engine_core.core import (
    AdmissionError,
    DecodeRun,
    EngineRole,
    Request,
    StepResult,
)
from services.common.perfmodel import get_profile
from services.common.routing.types import EndpointView, Pick, RequestView, Shed
from services.sim.autoscale import Planner, Served, Window
from services.sim.config import SimConfig
from services.sim.events import EventQueue
from services.sim.failures import FailureRecord, Failures
from services.sim.fleet import Engines, Instance
from services.sim.gateway_events import GatewayEvents
from services.sim.inputs import Arrival, Prompts, arrivals
from services.sim.memory import AgentMemory
from services.sim.records import Diag, SimRequest, lean_pick
from services.sim.routing import Gateways, note_pick, precise_matches
from services.sim.scalein import ScaleInRecord
from services.sim.scaling import Scaling
from services.sim.timeline import Timeline

__all__ = ["Progress", "SimRun", "Simulation"]

Progress = Callable[[int, int, float], None]
"""Called as (finished, total, modelled seconds) every few thousand events."""


@dataclass
class SimRun:
    """A finished run: every request's record and the run's counters."""

    config: SimConfig
    trace: Trace
    requests: list[SimRequest]  # in replay order (``index``)
    arrivals: list[Arrival]
    engines: Engines
    diag: Diag
    timeline: Timeline
    events: int
    autoscale: dict[str, Any] | None = None  # what the planner did (None: a fixed fleet)
    agent_memory: dict[str, Any] | None = None  # agent memory's measurements (None: off)
    scale_ins: list[ScaleInRecord] = field(default_factory=list)  # explicit and planner's
    failure: FailureRecord | None = None  # what an instance failure did (None: none asked)


class Simulation(Scaling, Failures, GatewayEvents):
    def __init__(
        self, cfg: SimConfig, trace: Trace, engines: Engines | None = None, narrow: bool = True
    ) -> None:
        """``narrow=False``: every routing cycle scores the whole fleet (the pre-filter of
        :mod:`services.sim.narrow` changes no decision; tests compare the two)."""
        self.cfg = cfg.validate()
        self.trace = trace
        self.perf = get_profile(cfg.engine_profile)
        if engines is None:
            roles = (
                [EngineRole.PREFILL] * cfg.prefill + [EngineRole.DECODE] * cfg.decode
                if cfg.pd
                else [EngineRole.AGGREGATED] * cfg.engines
            )
            engines = Engines(
                roles, self.perf, cfg.kv_blocks, cfg.block_size, mark=cfg.stream_interval,
                decode_keeps_kv=cfg.decode_keeps_kv, short_first_tokens=cfg.short_first_tokens,
                running_blocks=cfg.kv_running_blocks, max_batch=cfg.max_batch,
                max_batched_tokens=cfg.max_batched_tokens,
            )  # fmt: skip
        self.engines = engines
        self.gw = Gateways(cfg, [i.spec for i in engines], narrow)
        self.q = EventQueue()
        self.diag = Diag()
        self.timeline = Timeline(cfg.timeline_s * 1000.0, engines.roles())
        self.arrivals: list[Arrival] = arrivals(
            trace, cfg.max_requests, cfg.time_divisor, cfg.offset
        )
        self.reqs: dict[str, SimRequest] = {}  # the requests not ended yet
        self.lean_views: dict[str, EndpointView] = {}
        self.order: list[SimRequest] = []
        self.prompts = Prompts(trace.block_tokens)
        self.full_load = cfg.load_source == "stream"
        self.caches = {i.iid: i.core.cache for i in engines}
        a = cfg.autoscale
        if a is not None and "stream_interval" not in dict(a.planner):
            # the operator sets the planner's stream_interval to the engines' own
            a = replace(a, planner=(*a.planner, ("stream_interval", cfg.stream_interval)))
        self.planner = (
            Planner(engines.roles(), a, self.perf, cfg.kv_blocks * cfg.block_size)
            if a is not None
            else None
        )
        self.window = Window(a.window_s * 1000.0) if a is not None else None
        self.peak_replicas = self.initial_instances = len(engines)
        self.scale_ins: list[ScaleInRecord] = []
        self.failure: FailureRecord | None = None
        self.memory = (
            AgentMemory(cfg.agent_memory, self.caches, self.perf, cfg.block_size,
                        budget_share=cfg.memory_budget_share, tier_blocks=cfg.tier_blocks,
                        keep_unprotected=cfg.memory_offload == "pressure",
                        rebalance=cfg.memory_rebalance and not cfg.pd,
                        window_s=cfg.scale_in_window_s)
            if cfg.agent_memory is not None
            else None
        )  # fmt: skip

    # -- the run --------------------------------------------------------------------------
    def run(self, progress: Progress | None = None) -> SimRun:
        q, cfg = self.q, self.cfg
        for k, (at, _) in enumerate(self.arrivals):
            q.push(at, "arrive", k)
        n_eng = len(self.engines)
        for j, inst in enumerate(self.engines):  # phase-shifted scrapes
            q.push(cfg.scrape_interval_ms * j / n_eng, "scrape", inst)
        q.push(0.0, "sample", None)
        if cfg.autoscale is not None:
            q.push(cfg.autoscale.tick_s * 1000.0, "tick", None)
        if self.memory is not None:
            q.push(self.memory.tick_ms, "retain", None)
        if cfg.scale_in_at_s is not None:
            q.push(cfg.scale_in_at_s * 1000.0, "scale_in", None)
        if cfg.fail_at_s is not None:
            q.push(cfg.fail_at_s * 1000.0, "fail", None)
        if self.gw.sharing:
            q.push(cfg.share_heartbeat_ms, "beat", None)
        pending = total = len(self.arrivals)
        handlers: dict[str, Callable[[Any, float], int]] = {
            "arrive": self.arrive,
            "scrape": self.scrape,
            "load": self.load,
            "shape": self.shape,
            "wake": self.wake,
            "done": self.done,
            "sample": self.sample,
            "tick": self.tick,
            "ready": self.ready,
            "retain": self.retain,
            "scale_in": self.scale_in,
            "drain": self.drain,
            "share": self.share,
            "beat": self.beat,
            "ended": self.ended,
            "fail": self.fail,
            "detect": self.detect,
            "retry": self.retry,
        }
        tick = 0
        heap, pop = q.heap, heapq.heappop  # EventQueue.pop, inlined (millions of events)
        while pending and heap:
            now, _, kind, p = pop(heap)
            q.now = now
            pending -= handlers[kind](p, now)
            tick += 1
            if progress is not None and tick % 20_000 == 0:
                progress(total - pending, total, now / 1000.0)
        self.sample(None, q.now, final=True)
        for inst in self.engines:
            if inst.trace is not None:
                inst.trace.close()
        return SimRun(
            cfg,
            self.trace,
            sorted(self.order, key=lambda r: r.index),
            self.arrivals,
            self.engines,
            self.diag,
            self.timeline,
            q.pushed,
            self.autoscale_summary(),
            self.memory.summary() if self.memory is not None else None,
            self.scale_ins,
            self.failure,
        )

    def retain(self, _: Any, now: float) -> int:
        """The agent-memory round (retention, prefetch, samples)."""
        assert self.memory is not None
        self.memory.tick(now)
        if self.memory.rebalanced:
            self.learn_moves(self.memory.rebalanced, now)
        self.q.push(now + self.memory.tick_ms, "retain", None)
        return 0

    # -- event handlers (each returns how many requests ended) ----------------------------
    def scrape(self, inst: Instance, now: float) -> int:
        if inst.removed:
            return 0
        self.q.push(
            now + self.cfg.scrape_lag_ms,
            "load",
            (inst.iid, self.engines.load(inst, self.full_load, now)),
        )
        self.q.push(now + self.cfg.scrape_interval_ms, "scrape", inst)
        return 0

    def ended(self, p: tuple[int, str], now: float) -> int:
        """A gateway learns, ``end_lag_ms`` after the engine's last step, that a request ended."""
        self.gw.cores[p[0]].release(p[1])
        return 0

    def load(self, p: Any, now: float) -> int:
        if self.engines[p[0]].removed:
            return 0
        src = self.cfg.load_source
        for core in self.gw.cores:
            core.fleet.report_load(p[0], p[1], now / 1000.0, source=src)
        return 0

    def wake(self, inst: Instance, now: float) -> int:
        if inst.failed:
            return 0
        inst.wake_at = None
        self.kick(inst, now)
        return 0

    def sample(self, _: Any, now: float, final: bool = False) -> int:
        running = waiting = 0
        for inst in self.engines.live():
            running += inst.core.num_running
            waiting += inst.core.num_waiting
            # Nothing consumes the caches' KV events or filled-slot lists here (no kvmeta,
            # no data plane): the engines' caches keep none (``record=False``); a cache that
            # does is drained, or a long run's memory would grow with every block.
            inst.core.cache.drain_events()
            inst.core.cache.drain_filled()
        held = sum(s.held() for s in self.gw.shapers)
        self.timeline.sample(now, running, waiting + held, final=final)
        if not final:
            self.q.push(now + self.timeline.interval_ms, "sample", None)
        return 0

    def kick(self, inst: Instance, now: float) -> None:
        res = self.engines.step(inst, now)
        # Agent memory offloads on eviction: an allocation that evicted waits for those
        # offloads, which end here; then the step is tried again.
        mem = self.memory
        while mem is not None and mem.after_step(inst.core.cache):
            if isinstance(res, (StepResult, DecodeRun)):
                break
            again = self.engines.step(inst, now)
            res = again if again is not None else res  # None: the wake-up is already res
        if isinstance(res, DecodeRun):
            self.q.push(res.end, "done", (inst, res))
        elif isinstance(res, StepResult):
            self.q.push(now + res.duration_ms, "done", (inst, res))
        elif res is not None:
            self.q.push(res, "wake", inst)

    def arrive(self, k: int, now: float) -> int:
        """Route request ``k``; 1 when it ended at once (shed, refused), else 0."""
        cfg = self.cfg
        _, r = self.arrivals[k]
        toks, hashes = self.prompts.request(r, cfg.block_size)
        rid = f"r{k}"
        session = str(r.hash_ids[0]) if self.memory is not None and r.hash_ids else ""
        view = RequestView(
            rid, len(toks), hashes, cfg.block_size, max(1, r.output_length),
            ttft_slo_ms=cfg.slo_ttft_ms or 0.0, tpot_slo_ms=cfg.slo_tpot_ms or 0.0,
            session_id=session,
            prefix_matches=precise_matches(self.caches, hashes) if cfg.precise else None,
        )  # fmt: skip
        g = self.gw.choose()
        req = SimRequest(rid, k, now, toks, max(1, r.output_length), view, gateway=g)
        self.reqs[rid] = req
        self.order.append(req)
        if session and self.memory is not None:
            self.memory.arrive(rid, k, session, hashes, now)
        self.timeline.arrived(now)
        if self.window is not None:
            self.window.arrived(now)
        return self.route(req, now)

    def route(self, req: SimRequest, now: float) -> int:
        """Pick ``req``'s engine at its gateway and send it (or hold it at the shaper); 1
        when it ended at once (shed, no engine, refused)."""
        cfg, g, rid = self.cfg, req.gateway, req.rid
        core, hashes = self.gw.cores[g], req.view.block_hashes
        now_s = now / 1000.0
        match = self.gw.routed_prefix(g, hashes, now_s, rid)
        d = core.pick(req.view, now_s, rid, cfg.profile)
        self.publish(now)
        if not isinstance(d, Pick):  # refused (429) or no engine, as the live gateway would
            return self.end(req, "shed" if isinstance(d, Shed) else f"no engine: {d}", now)
        req.pick = d
        note_pick(self.diag, core, match, d)
        iid = req.target
        deadline = (req.arrival + cfg.slo_ttft_ms) / 1000.0 if cfg.slo_ttft_ms else None
        shaper = self.gw.shapers[g]
        cached = d.predicted_cached_tokens // cfg.block_size
        if not shaper.offer(
            rid, iid, d.predicted_prefill_ms, now_s, 0, deadline, hashes, cached,
            cfg.shaper_protect_ms,
        ):  # fmt: skip
            self.arm(g, iid)
            return 0
        return self.dispatch([rid], now)

    def end(self, req: SimRequest, error: str | None, now: float) -> int:
        req.error = error
        req.endings += 1
        req.prompt = ()  # the engines hold their own reference while they need it
        self.reqs.pop(req.rid, None)  # nothing refers to an ended request by its id
        if req.pick is not None:
            req.pick = lean_pick(req.pick, self.lean_views)
        if self.memory is not None:
            if error is None:
                self.memory.end(req.rid, req.home, now, prefill=req.target)
            else:
                self.memory.forget(req.rid)
        if not self.cfg.keep_block_hashes:  # a long run keeps every record
            req.view = replace(req.view, block_hashes=())
        if error is None:
            req.last = now
            if self.window is not None and req.first is not None:
                tpot = (now - req.first) / (req.ntok - 1) if req.ntok > 1 else None
                self.window.completed(
                    Served(now, req.first - req.arrival, tpot, req.prompt_tokens, req.cached,
                           req.ntok)
                )  # fmt: skip
        self.timeline.ended(now, req)
        return 1

    def dispatch(self, rids: list[str], now: float) -> int:
        """Send picked requests to their engines; how many ended at once (refused)."""
        ended = 0
        for rid in rids:
            req = self.reqs[rid]
            d = req.pick
            assert d is not None
            self.diag.held_ms += now - req.arrival
            inst = self.engines[req.target]
            dead = inst.iid if inst.failed else self._dead_decode(d)
            if dead:  # picked before membership dropped it: the call fails
                ended += self.upstream_failed(req, now, dead)
                continue
            fetched, wait = (
                self.memory.dispatch(rid, inst.iid, len(req.prompt), now)
                if self.memory is not None
                else (0, 0.0)
            )
            try:  # the live engine answers 400 here (and the bench counts it failed)
                inst.core.submit(
                    Request(
                        rid, req.prompt, req.out, hold_kv=d.prefill is not None,
                        block_hashes=req.view.block_hashes,
                        fetched_tokens=fetched, fetch_wait_ms=wait,
                    ),
                    now,
                )  # fmt: skip
            except AdmissionError as exc:
                core = self.gw.cores[req.gateway]
                core.abandon(rid)
                self.publish(now)
                core.release(rid)
                ended += self.end(req, f"engine refused: {exc}", now)
                freed = self.gw.shapers[req.gateway].done(rid, inst.iid, now / 1000.0)
                ended += self.dispatch(freed, now)
                continue
            if inst.trace is not None:
                inst.trace.submit(rid, now, len(req.prompt), req.out, 0.0)
            self.submitted(inst, now)
        return ended

    def _dead_decode(self, d: Pick) -> str:
        """A P/D pick's decode engine when it is dead ("" otherwise)."""
        if d.prefill is None:
            return ""
        iid = d.decode.endpoint.instance_id
        return iid if self.engines[iid].failed else ""

    def submitted(self, inst: Instance, now: float) -> None:
        """A request reached ``inst``'s queue: a decode run in progress ends at its next step
        end (its shortened end queued; the first one is then stale), else a step starts."""
        cut = self.engines.interrupt(inst, now)
        if cut is not None:
            self.q.push(cut.end, "done", (inst, cut))
        self.kick(inst, now)

    def done(self, p: tuple[Instance, StepResult | DecodeRun], now: float) -> int:
        inst, res = p
        if inst.failed:  # it died mid-step
            return 0
        if isinstance(res, DecodeRun):
            return self.run_done(inst, res, now)
        inst.busy = False
        if inst.trace is not None:
            inst.trace.outputs(now, res.outputs)
        if inst.core.config.role is EngineRole.PREFILL:
            for o in res.outputs:
                if (req := self.reqs.get(o.rid)) is not None:  # None: a call given up
                    self.hand_off(inst, req, o.prompt_tokens, o.cached_tokens, now)
            self.kick(inst, now)
            return 0
        if res.duration_ms > 0:
            g = self.diag
            g.steps += 1
            g.step_ms += res.duration_ms
            g.decode_seqs += res.decode_tokens
            if res.prefill_tokens:
                g.mixed_steps += 1
                g.mixed_ms += res.duration_ms
        finished = 0
        interval = self.cfg.stream_interval
        for o in res.outputs:
            req = self.reqs.get(o.rid)
            if req is None:  # a call given up (its engine's partner died)
                continue
            if req.prefilled_at is None:
                req.prefilled_at = now
            req.ntok = o.completion_tokens
            # The engine's first SSE chunk carries stream_interval tokens (or the last):
            # that is the client's first token and the gateway's first byte.
            if req.first is None and (req.ntok >= interval or o.finished):
                req.first = now
                req.cached = o.cached_tokens
                req.prompt_tokens = o.prompt_tokens
                self.gw.cores[req.gateway].first_token(o.rid)
                freed = self.gw.shapers[req.gateway].first_byte(o.rid, req.target, now / 1000.0)
                finished += self.dispatch(freed, now)
            if o.finished:
                if self.cfg.end_lag_ms > 0:
                    self.q.push(now + self.cfg.end_lag_ms, "ended", (req.gateway, o.rid))
                else:
                    self.gw.cores[req.gateway].release(o.rid)
                finished += self.end(req, None, now)
        self.kick(inst, now)
        return finished

    def run_done(self, inst: Instance, run: DecodeRun, now: float) -> int:
        """A decode run ended (a stale end of a run cut short is ignored): every running
        sequence got ``run.steps`` tokens; none finished or reached its first chunk."""
        if run is not inst.run:
            return 0
        inst.run = None
        inst.busy = False
        ran = inst.core.apply_run(run)
        if inst.core.config.output_mark is None:  # else a request's count comes with its end
            for rid in ran:
                self.reqs[rid].ntok += run.steps
        g = self.diag
        g.steps += run.steps
        g.step_ms += run.duration_ms
        g.decode_seqs += run.steps * run.batch
        self.kick(inst, now)
        return 0

    def hand_off(
        self, inst: Instance, req: SimRequest, prompt_tokens: int, cached: int, now: float
    ) -> None:
        """The prefill finished: the decode engine takes the KV (SGLang bootstrap)."""
        assert req.pick is not None
        dec = self.engines[req.pick.decode.endpoint.instance_id]
        xfer = self.perf.transfer_ms(prompt_tokens)
        inst.core.hand_off(req.rid, now + xfer)
        dec.core.submit(
            Request(
                req.rid,
                req.prompt,
                req.out,
                kv_transfer_ms=xfer,
                peer_cached_tokens=cached,
                block_hashes=req.view.block_hashes,
            ),
            now,
        )
        self.submitted(dec, now)
        self.q.push(now + xfer, "wake", inst)  # the held KV frees then
