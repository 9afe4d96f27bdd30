"""Instance failures (``SimConfig.fail_at_s``; a mixin of :class:`~services.sim.run.Simulation`).

At ``fail_at_s`` modelled seconds, ``fail_count`` serving engines (of ``fail_role``, or of
any role), chosen by the run's seed, die at once: no drain, and their KV is gone. What
follows is what the live gateway does (``services/scheduler/http/server.py`` and, for P/D,
``forward.py``):

- a request on a dead engine that has streamed its first chunk fails (the client's stream
  ends with an error event);
- one that has not is abandoned at its gateway (the routing plugins undo its pick), reported
  as an upstream failure to the gateway's fleet (its circuit breaker opens after a few), and
  retried on another engine, the dead one excluded, after the gateway's backoff
  (``retry_backoff_ms x 2^attempt x U[0.5, 1.5)``, seeded), at most ``retries`` times; then it
  fails. A retry is a new call: its engines know it under a new id (``r<k>.<attempt>``), so
  what an engine still had running for the old call counts for nothing;
- P/D: a request is on its prefill engine until that engine has handed its KV over (the
  transfer included), and on its decode engine from the dispatch on (the SGLang flow calls
  both at once), so a dead decode engine fails the requests still in prefill for it too. The
  live half of a failed pair forgets the request (the gateway cancels it);
- the gateways keep the dead engine in their fleets until membership drops it
  (``fail_detect_s`` later: its endpoints removed), so a pick of it in between fails at
  dispatch and is retried the same way;
- with the autoscaler on, the planner sees the fleet without it and starts replacements.

With agent memory, a dead engine's sessions lose what it held on the GPU and keep what the
tier holds; the reuse of each one's first dispatch afterwards (a turn in flight retried
elsewhere, or its next turn) is measured apart (``agent_memory.after_failure``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from services.common.engine_core.kvcache import KVCache
from services.sim.config import SimConfig
from services.sim.events import EventQueue
from services.sim.fleet import Engines, Instance
from services.sim.memory import AgentMemory
from services.sim.records import SimRequest
from services.sim.routing import Gateways

__all__ = ["FailureRecord", "Failures"]


@dataclass
class FailureRecord:
    """What one failure did (``at_ms``: when the engines died)."""

    at_ms: float
    instances: list[str]
    detected_ms: float
    failed: int = 0  # requests that failed because of it (streaming, or out of retries)
    retried: int = 0  # retries it caused (a request may be retried more than once)
    lost_blocks: int = 0  # cached blocks the dead engines held
    failed_rids: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {
            "at_s": round(self.at_ms / 1000.0, 3),
            "instances": self.instances,
            "detected_s": round(self.detected_ms / 1000.0, 3),
            "requests_failed": self.failed,
            "retries": self.retried,
            "lost_blocks": self.lost_blocks,
        }


class Failures:
    """The failure handlers; the attributes are the simulation's."""

    cfg: SimConfig
    engines: Engines
    gw: Gateways
    q: EventQueue
    reqs: dict[str, SimRequest]
    caches: dict[str, KVCache]
    failure: FailureRecord | None
    memory: AgentMemory | None

    if TYPE_CHECKING:  # the simulation's own

        def end(self, req: SimRequest, error: str | None, now: float) -> int: ...

        def dispatch(self, rids: list[str], now: float) -> int: ...

        def route(self, req: SimRequest, now: float) -> int: ...

        def publish(self, now: float) -> None: ...

        def submitted(self, inst: Instance, now: float) -> None: ...

    def fail(self, _: Any, now: float) -> int:
        """The engines die: their requests fail or are retried; membership learns later."""
        role = self.cfg.fail_role
        serving = sorted(
            i.iid
            for i in self.engines.live()
            if i.ready and not i.retiring and (role is None or i.role == role)
        )
        rng = random.Random(self.cfg.seed)
        dead = sorted(rng.sample(serving, min(self.cfg.fail_count, len(serving))))
        at = now + self.cfg.fail_detect_s * 1000.0
        rec = self.failure = FailureRecord(now, dead, at)
        for iid in dead:
            inst = self.engines[iid]
            inst.removed = inst.failed = True
            inst.run, inst.busy, inst.wake_at = None, False, None
            cache = self.caches.pop(iid, None)
            rec.lost_blocks += sum(map(len, cache.resident().values())) if cache else 0
        self.q.push(at, "detect", dead)
        if self.memory is not None:
            self.memory.engines_lost(dead)
        gone = set(dead)
        hit = [(r, c) for r in self.reqs.values() if (c := self._culprit(r, gone))]
        ended = 0
        for req, culprit in sorted(hit, key=lambda rc: rc[0].index):
            ended += self.upstream_failed(req, now, culprit)
        return ended

    def _culprit(self, req: SimRequest, dead: set[str]) -> str:
        """The dead engine ``req`` is on ("" when none): its prefill (or aggregated) engine
        while that one holds it, its decode engine once it was dispatched."""
        if req.pick is None:
            return ""
        target, home = req.target, req.home
        on_target = self.engines[target].core.knows(req.rid)
        if target in dead and on_target:
            return target
        if (
            home != target
            and home in dead
            and (on_target or self.engines[home].core.knows(req.rid))
        ):
            return home
        return ""

    def detect(self, dead: list[str], now: float) -> int:
        """Membership drops the dead engines from every gateway's fleet."""
        for core in self.gw.cores:
            for iid in dead:
                core.fleet.remove(iid)
        return 0

    def upstream_failed(self, req: SimRequest, now: float, culprit: str) -> int:
        """``req``'s engine ``culprit`` is dead: fail it once streaming, else retry it (1 if
        it ended)."""
        rec = self.failure
        assert rec is not None
        iid, g = req.target, req.gateway
        core, now_s = self.gw.cores[g], now / 1000.0
        streaming = req.first is not None
        if not streaming:
            core.abandon(req.rid)
            self.publish(now)
        core.fleet.upstream_result(culprit, False, now_s)
        core.release(req.rid)
        self._cancel_pair(req, culprit, now)
        ended = self.dispatch(self.gw.shapers[g].done(req.rid, iid, now_s), now)
        if streaming or req.attempts >= self.cfg.retries:
            rec.failed += 1
            rec.failed_rids.append(req.rid)
            why = "stream broken" if streaming else f"upstream failed after {req.attempts} retries"
            return ended + self.end(req, f"engine {culprit} failed: {why}", now)
        rec.retried += 1
        rng = random.Random(f"{self.cfg.seed}:r{req.index}:{req.attempts}")
        delay = self.cfg.retry_backoff_ms * 2**req.attempts * (0.5 + rng.random())
        req.attempts += 1
        del self.reqs[req.rid]
        old, req.rid = req.rid, f"r{req.index}.{req.attempts}"
        self.reqs[req.rid] = req
        if self.memory is not None:
            self.memory.renamed(old, req.rid)
        req.view = replace(req.view, request_id=req.rid, exclude=req.view.exclude | {culprit})
        req.pick = None
        self.q.push(now + delay, "retry", req.rid)
        return ended

    def _cancel_pair(self, req: SimRequest, culprit: str, now: float) -> None:
        """P/D: the live half of ``req``'s pair forgets it (a decode run in progress ends at
        its next step, as when a request arrives)."""
        for iid in {req.target, req.home} - {culprit}:
            inst = self.engines[iid]
            if not inst.failed and inst.core.knows(req.rid):
                inst.core.abort(req.rid)
                self.submitted(inst, now)

    def retry(self, rid: str, now: float) -> int:
        req = self.reqs.get(rid)
        return self.route(req, now) if req is not None else 0
