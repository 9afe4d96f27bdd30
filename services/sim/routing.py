"""The gateways: the scheduler's real :class:`~services.common.scheduling.GatewayCore` (routing
profiles, fleet view, reservations) and dispatch shaper, one per simulated gateway replica.

Each replica keeps its own reservations, routed-prefix index and dispatch order; every
replica receives every engine's load report. A request goes to a replica drawn with the
seeded RNG (a load balancer in front of the gateways). With ``share_state`` (the default, as
``tideserve up`` runs replicas) they share what live replicas share over Redis, through the
same pure rules (:mod:`services.common.scheduling.shared_state`): each pick's routed prefix
reaches the other replicas ``share_lag_ms`` later (:meth:`Gateways.take_shared` hands the
run the entries to deliver), and every ``share_heartbeat_ms`` each replica's in-flight
counts and dispatch backlog (:meth:`Gateways.heartbeat`).
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from functools import partial
from operator import itemgetter
from pathlib import Path

from tideserve.v1 import events_pb2

from services.common.admission.shaper import DispatchShaper
from services.common.admission.shaper_config import ShaperConfig
from services.common.engine_core.kvcache import KVCache
from services.common.routing.plugins.prefix import ApproxPrefix
from services.common.routing.plugins.routed_match import RoutedMatch
from services.common.routing.types import Pick, PrefixMatch, RequestView
from services.common.scheduling import EndpointSpec, GatewayCore, build_core
from services.common.scheduling.shared_state import (
    apply_carrier,
    apply_routed,
    approx_plugins,
    heartbeat,
    merge_backlog,
    merge_in_flight,
    pick_entry,
)
from services.sim.config import SimConfig
from services.sim.narrow import NarrowScheduler
from services.sim.records import Diag

__all__ = ["Gateways", "UnknownProfile"]


class UnknownProfile(ValueError):
    """The routing profile is not in the profiles file."""


class Gateways:
    def __init__(self, cfg: SimConfig, specs: list[EndpointSpec], narrow: bool = True) -> None:
        """``narrow``: the replicas' scheduler pre-filters repeated candidates
        (:mod:`services.sim.narrow`; the same decisions, fewer endpoints scored)."""
        self.cfg = cfg
        self.rng = random.Random(cfg.seed)
        self.cores: list[GatewayCore] = []
        self.shapers: list[DispatchShaper] = []
        self.approx: list[ApproxPrefix | None] = []
        for g in range(cfg.gateways):
            core = build_core(
                specs,
                profiles=Path(cfg.profiles_file) if cfg.profiles_file else None,
                seed=cfg.seed * 1_000 + g,
                block_size=cfg.block_size,
                perf_profile=cfg.gateway_perf_profile or cfg.engine_profile,
                decode_can_prefill=cfg.decode_can_prefill,
                scrape_queue_estimate=cfg.scrape_queue_estimate,
            )
            if narrow:
                core.scheduler = NarrowScheduler(core.scheduler)
            prof = core.scheduler.profiles.get(cfg.profile)
            if prof is None:
                known = ", ".join(sorted(core.scheduler.profiles))
                raise UnknownProfile(f"unknown routing profile {cfg.profile!r}; known: {known}")
            self.cores.append(core)
            self.approx.append(
                next((p for p in prof.preparers if isinstance(p, ApproxPrefix)), None)
            )
            self.shapers.append(
                DispatchShaper(
                    ShaperConfig(
                        cfg.shaper_hold_ms,
                        cfg.shaper_age_weight,
                        cfg.shaper_order,  # type: ignore[arg-type]
                        cfg.shaper_follow_ms,
                        protect=cfg.shaper_protect_ms > 0,
                        protect_slack=cfg.shaper_protect_slack,
                        protect_when_missed=cfg.shaper_protect_when_missed,
                    )
                )
            )

        self.sharing = cfg.share_state and cfg.gateways > 1
        self._shared: list[tuple[int, events_pb2.RoutedPrefix]] = []
        self._plugins = [approx_plugins(c.scheduler) for c in self.cores]
        self._max_age_s = max(
            (p.index.ttl_s for ps in self._plugins for p in ps.values()), default=0.0
        )
        if self.sharing:
            for g, core in enumerate(self.cores):
                core.pick_listeners.append(partial(self._picked, g))
                core.settle_listeners.append(partial(self._settled, g))

    # -- shared state (live: services.scheduler.feeds.shared over Redis) ------------------
    def _picked(self, g: int, view: RequestView, pick: Pick, now_s: float) -> None:
        self._publish(g, view, pick, int(now_s * 1000), retracted=False)

    def _settled(self, g: int, view: RequestView, pick: Pick, ok: bool) -> None:
        # a settle has no time: take_shared stamps it
        self._publish(g, view, pick, 0, retracted=not ok, answered=ok)

    def _publish(
        self, g: int, view: RequestView, pick: Pick, ts_ms: int, retracted: bool,
        answered: bool = False,
    ) -> None:  # fmt: skip
        entry = pick_entry(self.cores[g].scheduler, view, pick, deployment="",
                           replica_id=str(g), ts_ms=ts_ms, retracted=retracted,
                           answered=answered)  # fmt: skip
        if entry is not None:
            self._shared.append((g, entry))

    def take_shared(self, now_s: float) -> list[tuple[int, events_pb2.RoutedPrefix]]:
        """The entries the replicas published since the last call, stamped ``now_s`` where
        the publisher had no time (a retraction): the run delivers them later."""
        out, self._shared = self._shared, []
        for _, entry in out:
            if not entry.ts_ms:
                entry.ts_ms = int(now_s * 1000)
        return out

    def deliver(
        self, source: int, entry: events_pb2.RoutedPrefix, now_s: float
    ) -> list[tuple[int, str, list[str]]]:
        """Replica ``source``'s entry reaches every other replica at ``now_s``. Returns
        (replica, instance, requests its dispatch order lets go now) per instance where a
        foreign carrier's end (or time) set followers free (the run dispatches them)."""
        out: list[tuple[int, str, list[str]]] = []
        wall_ms = int(now_s * 1000)
        for g, plugins in enumerate(self._plugins):
            if g == source:
                continue
            apply_routed(plugins, entry, replica_id=str(g), now=now_s, wall_ms=wall_ms,
                         max_age_s=self._max_age_s)  # fmt: skip
            for iid, go in apply_carrier(
                self.shapers[g], entry, replica_id=str(g), now=now_s, wall_ms=wall_ms
            ).items():
                out.append((g, iid, go))
        return out

    def heartbeat(self, now_s: float) -> list[tuple[int, str, list[str]]]:
        """Every replica heartbeats its in-flight counts and dispatch backlog and reads the
        others' (at once: the heartbeat period is the lag); nothing without
        ``share_state``. Returns (replica, instance, requests its dispatch order lets go
        now) per instance with a foreign backlog (the run dispatches them)."""
        if not self.sharing:
            return []
        now_ms = int(now_s * 1000)
        beats = [
            heartbeat(
                c.fleet.own_in_flight(),
                deployment="",
                replica_id=str(g),
                ts_ms=now_ms,
                backlog_ms=self.shapers[g].own_backlog(now_s),
            )
            for g, c in enumerate(self.cores)
        ]
        ttl_ms = int(self.cfg.share_heartbeat_ms * 6)
        out: list[tuple[int, str, list[str]]] = []
        for g, c in enumerate(self.cores):
            rid = str(g)
            c.fleet.set_remote_in_flight(
                merge_in_flight(beats, replica_id=rid, now_ms=now_ms, ttl_ms=ttl_ms)
            )
            if self.shapers[g].enabled:
                foreign = merge_backlog(beats, replica_id=rid, now_ms=now_ms, ttl_ms=ttl_ms)
                for iid, go in self.shapers[g].set_foreign(foreign, now_s).items():
                    out.append((g, iid, go))
        return out

    def choose(self) -> int:
        """The replica a new request goes to."""
        n = len(self.cores)
        return 0 if n == 1 else self.rng.randrange(n)

    def routed_prefix(
        self, g: int, hashes: tuple[int, ...], now_s: float, request_id: str = ""
    ) -> Mapping[str, int]:
        """Replica ``g``'s routed-prefix match per instance (diagnostics), {} without one."""
        ap = self.approx[g]
        if ap is None:
            return {}
        m = ap.lookup(request_id, hashes, now_s)  # the cycle's own lookup (made once)
        sched = self.cores[g].scheduler
        if isinstance(sched, NarrowScheduler):
            sched.hint(request_id, now_s, ap.index, m)
        return m


def precise_matches(
    caches: Mapping[str, KVCache], hashes: tuple[int, ...]
) -> dict[str, PrefixMatch]:
    """Each engine's resident prefix of ``hashes`` (GPU tier), as a lag-free KV index has it."""
    chain = list(hashes)
    out: dict[str, PrefixMatch] = {}
    for iid, cache in caches.items():
        n = cache.match(chain)
        if n:
            out[iid] = PrefixMatch(n, {"gpu": n})
    return out


def note_pick(diag: Diag, core: GatewayCore, match: Mapping[str, int], d: Pick) -> None:
    """Count whether the pick kept the longest routed prefix, and if not which scorer won."""
    diag.picks += 1
    diag.disaggregated += d.prefill is not None
    diag.predicted_cached += d.predicted_cached_tokens
    choice = d.prefill or d.decode
    target = choice.endpoint.instance_id
    want_prefill = d.prefill is not None
    # The longest match among the instances of the pick's pool (an instance scaled in since
    # the prefix was routed there is no longer in the fleet): the first such in descending
    # order of length, most of a large fleet's matches never looked at.
    fleet = core.fleet
    best = 0
    head = _first_longest(match)  # mostly the first longest is one: found without sorting
    if head is not None:
        first, longest = head
        if longest > 0 and first in fleet and (fleet.spec(first).role == "prefill") == want_prefill:
            best = longest
    if not best:
        for i, n in sorted(match.items(), key=itemgetter(1), reverse=True):
            if n <= 0:
                break
            if i in fleet and (fleet.spec(i).role == "prefill") == want_prefill:
                best = n
                break
    if best <= 0:
        return
    diag.with_prefix += 1
    diag.best_blocks += best
    got = match.get(target, 0)
    if got >= best:
        diag.kept_best += 1
        return
    diag.lost_blocks += best - got
    top = max(choice.scores, key=lambda s: s[1] * s[2], default=("?", 0.0, 0.0))
    diag.reasons[top[0]] = diag.reasons.get(top[0], 0) + 1


def _first_longest(match: Mapping[str, int]) -> tuple[str, int] | None:
    """The first instance of ``match`` with its greatest length (None: empty); a routed
    match answers from its masks without building its dict."""
    if isinstance(match, RoutedMatch):
        return match.longest()
    if not match:
        return None
    lengths = list(match.values())
    longest = max(lengths)
    return list(match)[lengths.index(longest)], longest
