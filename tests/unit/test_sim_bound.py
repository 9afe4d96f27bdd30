"""The simulator's pre-filter by score bounds (services/sim/bound.py) changes no decision:
a scheduler with it and one without, fed the same cycles, make the same picks with the same
scores, while it scores a few of the candidates."""

from __future__ import annotations

import random
import zlib
from dataclasses import dataclass

import numpy as np
import pytest

from services.common.routing.framework import Scheduler
from services.common.routing.plugins.placement import SessionLoad
from services.common.routing.types import (
    Choice,
    EndpointSnapshot,
    EndpointView,
    Pick,
    RequestView,
)
from services.common.scheduling import EndpointSpec, build_core
from services.sim import bound
from services.sim.bound import BoundFilter, bound_plan
from services.sim.bound_fleet import FleetColumns
from services.sim.narrow import NarrowScheduler


@dataclass(frozen=True)
class Case:
    profile: str
    instances: int = 80  # from services.sim.narrow.BOUND_MIN on
    long_prompts: float = 0.0  # share of prompts long enough for session-load to score
    spread: int = 3  # load fields drawn from range(spread): small = many equal candidates
    engine_fields: bool = False  # pending prefill and throughput reported (the load stream)
    patched: bool = False  # each cycle's snapshot the last one with a few views replaced


CASES = [
    Case("default"),
    Case("default", long_prompts=0.5),
    Case("default", spread=1),  # an idle fleet: every candidate equal but for the prefix
    Case("default", instances=300, spread=8),
    Case("default", engine_fields=True),
    Case("tpot-guard", long_prompts=0.3),  # ttft-cost's decode term
    Case("least_load"),
    Case("default", engine_fields=True, patched=True),
    Case("decode-tpot", long_prompts=0.5, engine_fields=True),  # its stall scored
    Case("decode-tpot", long_prompts=0.5),  # no tokens in flight reported: decode_tokens
    Case("decode-tpot-spread", long_prompts=0.5, engine_fields=True, patched=True),
]
IDS = ["default", "long-prompts", "idle-fleet", "300-instances", "load-stream", "tpot-guard",
       "least-load", "patched-snapshots", "decode-tpot", "decode-tpot-no-engine-fields",
       "decode-tpot-spread"]  # fmt: skip


def scheduler(n: int) -> Scheduler:
    return build_core([EndpointSpec(f"worker-{i}", f"http://w{i}") for i in range(n)]).scheduler


def snapshot(
    rng: random.Random, case: Case, last: EndpointSnapshot | None = None, version: int = 0
) -> EndpointSnapshot:
    """A fleet of random loads; with ``case.patched``, ``last`` with 0-5 views replaced (as
    the gateway's fleet patches its snapshot), which the filter follows by position."""
    s = case.spread

    def view(i: int) -> EndpointView:
        return EndpointView(
            f"worker-{i}",
            running=rng.randrange(s),
            waiting=rng.randrange(s) * rng.randrange(2),
            tokens_in_flight=rng.randrange(s) * 100 if case.engine_fields else 0,
            pending_prefill_tokens=rng.randrange(s) * 500 if case.engine_fields else 0,
            prefill_tokens_per_s=rng.choice([0.0, 5e3, 5e5]) if case.engine_fields else 0.0,
            kv_usage=rng.randrange(s) / 8,
            reserved_requests=rng.randrange(s) // 2,
            reserved_tokens=rng.randrange(s) // 2 * 700,
        )

    if case.patched and last is not None:
        changed = [view(rng.randrange(case.instances)) for _ in range(rng.randrange(6))]
        return last.replaced(changed, version)
    return EndpointSnapshot([view(i) for i in range(case.instances)])


def request(rng: random.Random, k: int, case: Case) -> RequestView:
    conv = rng.randrange(12)
    blocks = rng.randrange(1, 40)
    hashes = (7, *range(conv * 1000 + 1, conv * 1000 + blocks))  # one shared first block
    tokens = blocks * 64 - rng.randrange(64)
    if rng.random() < case.long_prompts:
        tokens += 40_000
    return RequestView(f"r{k}", tokens, hashes, 64, 16)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_the_same_picks_with_and_without_the_bound(case: Case) -> None:
    rng = random.Random(zlib.crc32(repr(case).encode()))
    whole, narrow = scheduler(case.instances), NarrowScheduler(scheduler(case.instances))
    kept: list[int] = []
    original = narrow._bound.kept

    def counted(*args: object) -> list[int]:
        out = original(*args)  # type: ignore[arg-type]
        kept.append(len(out))
        return out

    narrow._bound.kept = counted  # type: ignore[assignment,method-assign]
    unanswered: list[tuple[RequestView, Pick]] = []
    snap: EndpointSnapshot | None = None
    for k in range(150):
        snap, req, now = snapshot(rng, case, snap, k), request(rng, k, case), k * 0.05
        want = whole.schedule(req, snap, now, case.profile)
        got = narrow.schedule(req, snap, now, case.profile)
        assert got == want, f"cycle {k}"
        assert isinstance(got, Pick)
        unanswered.append((req, got))
        while unanswered and rng.random() < 0.6:  # some picks answer
            r, p = unanswered.pop(rng.randrange(len(unanswered)))
            whole.settle(r, p, True)
            narrow.settle(r, p, True)
    assert len(kept) == 150
    assert sum(kept) < 150 * case.instances / 3


@pytest.mark.parametrize(
    ("profile", "applies"),
    [("default", True), ("tpot-guard", True), ("least_load", True), ("decode-tpot", True),
     ("decode-tpot-spread", True), ("prefix-ready", False), ("slo", False),
     ("cache_aware", False), ("power_of_two", False)],
    ids=["default", "tpot-guard", "least-load", "decode-tpot", "decode-tpot-spread",
         "prefix-ready-unfinished", "slo-filter", "cache-aware", "power-of-two"],
)  # fmt: skip
def test_which_profiles_the_bound_applies_to(profile: str, applies: bool) -> None:
    prof = scheduler(2).profiles[profile]
    assert (bound_plan(prof) is not None) == applies


def test_equal_candidates_are_kept_once() -> None:
    """An idle fleet with nothing of the prompt anywhere: the first candidate stands for
    all (every input equal), and it is the pick."""
    sched = scheduler(50)
    plan = bound_plan(sched.profiles["default"])
    assert plan is not None
    snap = EndpointSnapshot([EndpointView(f"worker-{i}") for i in range(50)])
    kept = BoundFilter().kept(plan, RequestView("a", 1000, (1, 2), 64, 8), snap, 0.0)
    assert kept == [0]


@pytest.mark.parametrize("collide", [False, True], ids=["grouped-by-sum", "sums-collide"])
def test_repeats_are_dropped_after_their_first(
    collide: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Equal inputs keep their first position; a weighted sum shared by unequal inputs
    (forced here) falls back to comparing them one by one."""
    if collide:
        monkeypatch.setattr(bound, "_MIX", np.zeros(32))
    cols = np.array([[1, 2, 1, 3, 2, 1, 4, 5, 1, 6], [0, 0, 0, 1, 0, 0, 0, 0, 1, 0]], float)
    cached = np.array([5, 5, 5, 5, 5, 5, 5, 5, 5, 7], float)
    sel = np.ones(10, dtype=bool)
    sel[7] = False
    assert bound._first_of_equals(sel, cols, [cached]) == [0, 1, 3, 6, 8, 9]


@pytest.mark.parametrize("takeover", [False, True], ids=["followed", "marks-taken-over"])
def test_session_load_columns_follow_the_commitments(takeover: bool) -> None:
    """session-load's commitment columns, kept up to date from the instances its picks
    touch, equal columns read afresh from its commitments (time ``now`` where none)."""
    prof = scheduler(2).profiles["default"]
    plugin = next(s for s, _ in prof.scorers if type(s) is SessionLoad)
    snap = EndpointSnapshot([EndpointView(f"worker-{i}") for i in range(6)])
    fleet = FleetColumns(snap)
    rng = random.Random(3)
    for k in range(40):
        now = k * 0.5
        if takeover and k == 20:
            plugin.touched = set()  # another follower installed its own marks
        iid = f"worker-{rng.randrange(7)}"  # worker-6 is not in the fleet
        pick = Pick(decode=Choice(EndpointView(iid), 1.0), prefill=None, profile="default")
        plugin.on_pick(now, RequestView(f"r{k}", 1000 + k, (1,), 64, 8), pick)
        v, t = fleet.committed(plugin, now + 0.25)
        held = plugin._committed
        want_v = [held.get(e.instance_id, (0.0, 0.0))[0] for e in snap]
        want_t = [held.get(e.instance_id, (0.0, now + 0.25))[1] for e in snap]
        assert v.tolist() == want_v and t.tolist() == want_t, k
