"""The gateways: the scheduler's real :class:`~services.common.scheduling.GatewayCore` (routing
profiles, fleet view, reservations) and dispatch shaper, one per simulated gateway replica.

Each replica keeps its own reservations, routed-prefix index and dispatch order, as live
active-active gateways without a shared replica stream do; every replica receives every
engine's load report. A request goes to a replica drawn with the seeded RNG (a load
balancer in front of the gateways).
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from operator import itemgetter
from pathlib import Path

from services.common.admission.shaper import DispatchShaper, ShaperConfig
from services.common.engine_core.kvcache import KVCache
from services.common.routing.plugins.prefix import ApproxPrefix
from services.common.routing.plugins.routed_match import RoutedMatch
from services.common.routing.types import Pick, PrefixMatch
from services.common.scheduling import EndpointSpec, GatewayCore, build_core
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
