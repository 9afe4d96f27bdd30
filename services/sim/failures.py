"""Instance failures (``SimConfig.fail_at_s``; a mixin of :class:`~services.sim.run.Simulation`).

At ``fail_at_s`` modelled seconds, ``fail_count`` serving engines, chosen by the run's seed,
die at once: no drain, and their KV is gone. What follows is what the live gateway does
(``services/scheduler/http/server.py``):

- a request on a dead engine that has streamed its first chunk fails (the client's stream
  ends with an error event);
- one that has not is abandoned at its gateway (the routing plugins undo its pick), reported
  as an upstream failure to the gateway's fleet (its circuit breaker opens after a few), and
  retried on another engine, the dead one excluded, after the gateway's backoff
  (``retry_backoff_ms x 2^attempt x U[0.5, 1.5)``, seeded), at most ``retries`` times; then it
  fails;
- the gateways keep the dead engine in their fleets until membership drops it
  (``fail_detect_s`` later: its endpoints removed), so a pick of it in between fails at
  dispatch and is retried the same way;
- with the autoscaler on, the planner sees the fleet without it and starts replacements.

Aggregated fleets without agent memory (the configuration refuses the rest).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from services.common.engine_core.kvcache import KVCache
from services.sim.config import SimConfig
from services.sim.events import EventQueue
from services.sim.fleet import Engines
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

    if TYPE_CHECKING:  # the simulation's own

        def end(self, req: SimRequest, error: str | None, now: float) -> int: ...

        def dispatch(self, rids: list[str], now: float) -> int: ...

        def route(self, req: SimRequest, now: float) -> int: ...

        def publish(self, now: float) -> None: ...

    def fail(self, _: Any, now: float) -> int:
        """The engines die: their requests fail or are retried; membership learns later."""
        serving = sorted(i.iid for i in self.engines.live() if i.ready and not i.retiring)
        rng = random.Random(self.cfg.seed)
        dead = sorted(rng.sample(serving, min(self.cfg.fail_count, len(serving))))
        at = now + self.cfg.fail_detect_s * 1000.0
        rec = self.failure = FailureRecord(now, dead, at)
        on: list[SimRequest] = []
        for iid in dead:
            inst = self.engines[iid]
            inst.removed = inst.failed = True
            inst.run, inst.busy, inst.wake_at = None, False, None
            cache = self.caches.pop(iid, None)
            rec.lost_blocks += sum(map(len, cache.resident().values())) if cache else 0
            on += [r for r in self.reqs.values() if r.target == iid and inst.core.knows(r.rid)]
        self.q.push(at, "detect", dead)
        ended = 0
        for req in sorted(on, key=lambda r: r.index):
            ended += self.upstream_failed(req, now)
        return ended

    def detect(self, dead: list[str], now: float) -> int:
        """Membership drops the dead engines from every gateway's fleet."""
        for core in self.gw.cores:
            for iid in dead:
                core.fleet.remove(iid)
        return 0

    def upstream_failed(self, req: SimRequest, now: float) -> int:
        """``req``'s engine is dead: fail it once streaming, else retry it (1 if it ended)."""
        rec = self.failure
        assert rec is not None
        iid, g = req.target, req.gateway
        core, now_s = self.gw.cores[g], now / 1000.0
        streaming = req.first is not None
        if not streaming:
            core.abandon(req.rid)
            self.publish(now)
        core.fleet.upstream_result(iid, False, now_s)
        core.release(req.rid)
        ended = self.dispatch(self.gw.shapers[g].done(req.rid, iid, now_s), now)
        if streaming or req.attempts >= self.cfg.retries:
            rec.failed += 1
            rec.failed_rids.append(req.rid)
            why = "stream broken" if streaming else f"upstream failed after {req.attempts} retries"
            return ended + self.end(req, f"engine {iid} failed: {why}", now)
        rec.retried += 1
        rng = random.Random(f"{self.cfg.seed}:{req.rid}:{req.attempts}")
        delay = self.cfg.retry_backoff_ms * 2**req.attempts * (0.5 + rng.random())
        req.attempts += 1
        req.view = replace(req.view, exclude=req.view.exclude | {iid})
        req.pick = None
        self.q.push(now + delay, "retry", req.rid)
        return ended

    def retry(self, rid: str, now: float) -> int:
        req = self.reqs.get(rid)
        return self.route(req, now) if req is not None else 0
