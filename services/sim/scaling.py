"""How the simulated fleet changes size (a mixin of :class:`~services.sim.run.Simulation`):
the SLA planner's ticks (``SimConfig.autoscale``, :mod:`services.sim.autoscale`), the
explicit scale-in (``SimConfig.scale_in_at_s``, :mod:`services.sim.scalein`), and the path
both take: a victim is retired at the gateways (drain), and once drained its agent
sessions are migrated and it leaves, its KV with it.
"""

from __future__ import annotations

from typing import Any

from services.common.engine_core.kvcache import KVCache
from services.common.planner.ports import InstanceView
from services.common.planner.victims import pick_victims
from services.sim.autoscale import Planner, Window
from services.sim.config import SimConfig
from services.sim.events import EventQueue
from services.sim.fleet import Engines, Instance
from services.sim.memory import AgentMemory
from services.sim.routing import Gateways
from services.sim.scalein import DRAIN_CHECK_MS, ScaleInRecord
from services.sim.timeline import Timeline

__all__ = ["Scaling"]


class Scaling:
    """The fleet-size handlers; the attributes are the simulation's."""

    cfg: SimConfig
    engines: Engines
    gw: Gateways
    q: EventQueue
    timeline: Timeline
    caches: dict[str, KVCache]
    memory: AgentMemory | None
    planner: Planner | None
    window: Window | None
    peak_replicas: int
    initial_instances: int
    scale_ins: list[ScaleInRecord]

    def autoscale_summary(self) -> dict[str, Any] | None:
        if self.planner is None:
            return None
        return {
            "scaling_decisions": self.planner.decisions,
            "instances_started": len(self.engines) - self.initial_instances,
            "instances_removed": sum(i.removed for i in self.engines),
            "peak_replicas": self.peak_replicas,
            "final_replicas": self.engines.roles(),
            "forecast": {
                "predictor": self.planner.planner_cfg.predictor,
                "bucket_s": self.planner.planner_cfg.bucket_s,
                "season_s": self.planner.planner_cfg.season_s,
            },
        }

    def tick(self, payload: Any, now: float) -> int:
        """A planner tick: its targets start instances or drain its victims."""
        assert self.planner is not None and self.window is not None
        live = self.engines.live()
        views = self.views([i for i in live if not i.removed], now)
        d = self.planner.tick(now / 1000.0, views, self.window.view(now))
        victims = set(d.victims)
        for inst in live:
            if inst.iid in victims and not inst.retiring:
                if inst.ready:  # measured as the explicit scale-in's victims are
                    self.scale_ins.append(ScaleInRecord(inst.iid, now))
                self.retire(inst)
        for role, target in d.targets.items():
            have = sum(1 for i in live if i.role == role and not i.retiring and not i.removed)
            for _ in range(target - have):
                new = self.engines.add(role, ready=False)
                self.q.push(now + self.planner.cfg.startup_s * 1000.0, "ready", new)
        self.leave_drained(now)
        self.timeline.replicas = self.engines.roles()
        self.q.push(now + self.planner.cfg.tick_s * 1000.0, "tick", None)
        return 0

    def views(self, insts: list[Instance], now: float = 0.0) -> tuple[InstanceView, ...]:
        """What the autoscaler sees of ``insts`` (victim choice: load and session KV; the
        scale-in floor: the active sessions' prefix tokens; a retiring one as draining)."""
        mem = self.memory
        kv = mem.session_blocks() if mem is not None else {}
        act = mem.active_blocks(now, mem.window_s) if mem is not None else {}
        size = self.cfg.block_size
        return tuple(
            Planner.instance(
                i.iid, i.role, i.ready, i.core.num_waiting if i.ready else 0, i.core.num_running,
                kv.get(i.iid, 0), act.get(i.iid, 0) * size, i.retiring,
            )
            for i in insts
        )  # fmt: skip

    def scale_in(self, _: Any, now: float) -> int:
        """The explicit scale-in (:mod:`services.sim.scalein`): the victim rule's picks are
        retired, then checked until drained."""
        serving = [i for i in self.engines.live() if i.ready and not i.retiring]
        keep = len(serving) - self.cfg.scale_in_count
        for iid in pick_victims(self.views(serving, now), "worker", keep):
            self.scale_ins.append(ScaleInRecord(iid, now))
            self.retire(self.engines[iid])
        return self.drain(None, now)

    def drain(self, _: Any, now: float) -> int:
        self.leave_drained(now)
        if any(not self.engines[r.iid].removed for r in self.scale_ins):
            self.q.push(now + DRAIN_CHECK_MS, "drain", None)
        return 0

    def leave_drained(self, now: float) -> None:
        """Retiring instances that drained (idle, no gateway counts a request on them) leave,
        their sessions migrated first; their KV is gone with them."""
        live = self.engines.live()
        for inst in live:
            if not inst.retiring or inst.removed or not inst.idle:
                continue
            if any(core.fleet.in_flight(inst.iid) for core in self.gw.cores):
                continue
            inst.removed = True
            rec = next((r for r in self.scale_ins if r.iid == inst.iid), None)
            mem, window = self.memory, self.cfg.scale_in_window_s
            chains = mem.active_chains(inst.iid, now, window) if mem and rec else {}
            if mem is not None and rec is not None:  # what stays cached without migrating
                rec.kept_unmigrated_blocks = sum(
                    mem.kept_blocks(c, without=inst.iid) for c in chains.values()
                )
            if mem is not None:
                stay = [i.iid for i in live if i.role == inst.role and i.ready
                        and not i.retiring and not i.removed]  # fmt: skip
                mem.migrate(inst.iid, stay, now)
                self.learn_moves(mem.moved, now)
            self.caches.pop(inst.iid, None)  # also agent memory's view of the fleet
            if rec is not None:
                rec.removed_ms, rec.sessions = now, sorted(chains)
                rec.prefix_blocks = sum(len(c) for c in chains.values())
                if mem is not None:
                    rec.kept_blocks = sum(mem.kept_blocks(c) for c in chains.values())
        self.timeline.replicas = self.engines.roles()

    def learn_moves(self, moved: list[tuple[str, str, tuple[int, ...]]], now: float) -> None:
        """Each gateway's routed-prefix index learns where migrated sessions' prefixes went
        (the destination's fetch announces them with its KV events in the product; the
        simulator's gateways have no KV index), so their next turns follow their KV."""
        for ap in self.gw.approx:
            if ap is None:
                continue
            for _, iid, chain in moved:
                ap.index.insert(chain, iid, now / 1000.0)

    def retire(self, inst: Instance) -> None:
        inst.retiring = True
        if not inst.ready:  # still starting: stopped at once
            inst.removed = True
            return
        for core in self.gw.cores:
            core.fleet.retire(inst.iid)

    def ready(self, inst: Instance, now: float) -> int:
        """A started instance is up: the gateways learn of it (membership) and scrape it."""
        if inst.removed:
            return 0
        inst.ready = True
        for core in self.gw.cores:
            core.fleet.upsert(inst.spec)
        self.caches[inst.iid] = inst.core.cache
        self.q.push(now, "scrape", inst)
        self.timeline.replicas = self.engines.roles()
        self.peak_replicas = max(self.peak_replicas, sum(self.timeline.replicas.values()))
        return 0
