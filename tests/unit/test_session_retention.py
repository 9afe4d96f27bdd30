"""The retention rule (budget, offload order, pressure, tier room, release) and prefetch
timing with fetch-or-recompute."""

from __future__ import annotations

import pytest

from services.common.perfmodel import DEFAULT_PROFILE, get_profile
from services.common.sessions import (
    Arrival,
    IdleSession,
    TierLink,
    fetch_ms,
    on_arrival,
    plan_prefetch,
    plan_retention,
    recompute_ms,
)
from services.common.sessions.retention import RetentionPlan

NOW = 100.0


def s(
    key: str, blocks: int, ret: float | None, last: float = 0.0, ended: bool = False
) -> IdleSession:
    return IdleSession(key, blocks, last, ret, ended)


def keys(plan: RetentionPlan) -> tuple[tuple[object, ...], ...]:
    return plan.protected, plan.offload, plan.kept, plan.drop, plan.release


EAGER = {"keep_unprotected": False}


@pytest.mark.parametrize(
    ("idle", "kw", "protected", "offload", "kept", "drop", "release"),
    [
        # 1000 blocks, 20 %: 200 blocks of budget; soonest return first; no pressure: the
        # rest stays on the GPU as evictable cache
        ([s("a", 100, 110), s("b", 100, 120), s("c", 100, 130)], {}, ["b", "a"], [], ["c"],
         [], []),
        # a big one that does not fit is skipped, a smaller later one still fits
        ([s("a", 150, 110), s("big", 100, 120), s("c", 50, 130)], {}, ["c", "a"], [], ["big"],
         [], []),
        # eager: every unprotected session offloaded at once, pressure or not
        ([s("a", 100, 110), s("b", 100, 120), s("c", 100, 130)], EAGER, ["b", "a"], ["c"], [],
         [], []),
        # offload order (eager): overdue (return passed) first, then unknown, then furthest
        # return first
        ([s("far", 300, 500), s("late", 10, 90, 5), s("unk", 10, None, 1), s("mid", 300, 300)],
         EAGER, [], ["late", "unk", "far", "mid"], [], [], []),
        # the same order for what is kept
        ([s("far", 300, 500), s("late", 10, 90, 5), s("unk", 10, None, 1), s("mid", 300, 300)],
         {}, [], [], ["late", "unk", "far", "mid"], [], []),
        # overdue ones among themselves: least recently used first
        ([s("x", 10, 50, 9), s("y", 10, 60, 3)], EAGER, [], ["y", "x"], [], [], []),
        # ended sessions are released, never protected even if they would fit
        ([s("a", 10, 110, ended=True), s("b", 10, 120)], {}, ["b"], [], [], [], ["a"]),
        # pressure: released and unprotected blocks first, then protected coldest first
        ([s("a", 100, 110), s("b", 100, 120), s("c", 50, None), s("e", 20, 1, ended=True)],
         {"need_blocks": 150}, ["a"], ["c", "b"], [], [], ["e"]),
        # pressure met by the coldest unprotected: the warmer unprotected stay, so does
        # protection
        ([s("a", 100, 110), s("c", 300, None), s("d", 150, 900), s("o", 50, 90)],
         {"need_blocks": 250}, ["a"], ["o", "c"], ["d"], [], []),
        # pressure already met by what is released: nothing offloaded
        ([s("a", 100, 110), s("c", 300, None), s("e", 60, 1, ended=True)],
         {"need_blocks": 50}, ["a"], [], ["c"], [], ["e"]),
        # the tier is short: the coldest go to drop, the warmer ones still fit
        ([s("late", 60, 50), s("far", 60, 900), s("near", 300, 400)],
         {"tier_free_blocks": 100, "budget_share": 0.0, **EAGER}, [], ["far"], [],
         ["late", "near"], []),
        ([s("a", 10, 110)], {"budget_share": 0.0}, [], [], ["a"], [], []),
        ([s("a", 10, 110)], {"budget_share": 0.0, **EAGER}, [], ["a"], [], [], []),
        ([], {}, [], [], [], [], []),
    ],
    ids=[
        "budget-soonest-first-rest-kept",
        "skip-what-does-not-fit",
        "eager-offloads-the-rest",
        "offload-order",
        "kept-order",
        "overdue-lru",
        "ended-released",
        "pressure-takes-protected-coldest-first",
        "pressure-offloads-coldest-only",
        "pressure-met-by-released",
        "tier-short-drops-coldest",
        "zero-budget-kept",
        "zero-budget-eager",
        "nothing-idle",
    ],
)  # fmt: skip
def test_plan_retention(
    idle: list[IdleSession],
    kw: dict[str, float],
    protected: list[str],
    offload: list[str],
    kept: list[str],
    drop: list[str],
    release: list[str],
) -> None:
    plan = plan_retention(1000, idle, NOW, **kw)  # type: ignore[arg-type]
    want = (tuple(protected), tuple(offload), tuple(kept), tuple(drop), tuple(release))
    assert keys(plan) == want
    assert plan.protected_blocks <= plan.budget_blocks
    assert plan.protected_blocks == sum(i.blocks for i in idle if i.key in plan.protected)
    # every idle session is in exactly one list
    assert sorted(k for lst in keys(plan) for k in lst) == sorted(i.key for i in idle)  # type: ignore[type-var]


@pytest.mark.parametrize(
    "kw",
    [
        {"capacity_blocks": -1},
        {"need_blocks": -1},
        {"budget_share": 1.5},
        {"tier_free_blocks": -1},
    ],
    ids=["capacity", "need", "share", "tier"],
)
def test_plan_retention_refuses_bad_input(kw: dict[str, float]) -> None:
    args: dict[str, float] = {"capacity_blocks": 10, **kw}
    cap = int(args.pop("capacity_blocks"))
    with pytest.raises(ValueError):
        plan_retention(cap, [], NOW, **args)  # type: ignore[arg-type]


LINK = TierLink(bandwidth_bytes_s=1e9, latency_ms=2.0)


@pytest.mark.parametrize(
    ("tokens", "kv_bytes", "link", "expect"),
    [
        (0, 1000, LINK, 0.0),
        (1000, 1000, LINK, 3.0),  # 1 MB at 1 GB/s = 1 ms, plus 2 ms latency
        (1, 1, TierLink(0.0), float("inf")),
    ],
    ids=["nothing", "bytes-plus-latency", "no-link"],
)
def test_fetch_ms(tokens: int, kv_bytes: int, link: TierLink, expect: float) -> None:
    assert fetch_ms(tokens, kv_bytes, link) == pytest.approx(expect)


def test_recompute_is_the_prefill_the_prefix_adds() -> None:
    p = get_profile(DEFAULT_PROFILE)
    assert recompute_ms(p, 0, 100) == 0.0
    assert recompute_ms(p, 4096) == pytest.approx(p.prefill_ms(4096))
    with_suffix = recompute_ms(p, 4096, 512)
    assert with_suffix == pytest.approx(p.prefill_ms(4608) - p.prefill_ms(512, 4096))
    assert with_suffix > 0


@pytest.mark.parametrize(
    ("ret", "fetch", "recompute", "fetch_it", "start"),
    [
        (200.0, 1000.0, 5000.0, True, 200.0 - 1.2 - 0.5),
        (100.5, 1000.0, 5000.0, True, NOW),  # already late: start now
        (200.0, 5000.0, 5000.0, False, 200.0),  # fetching is no faster: recompute
        (200.0, 9000.0, 100.0, False, 200.0),
    ],
    ids=["lead-with-margins", "late-starts-now", "tie-recomputes", "slow-link-recomputes"],
)
def test_plan_prefetch(
    ret: float, fetch: float, recompute: float, fetch_it: bool, start: float
) -> None:
    plan = plan_prefetch(ret, NOW, fetch_cost_ms=fetch, recompute_cost_ms=recompute)
    assert plan.fetch is fetch_it
    assert plan.start_at == pytest.approx(start)


@pytest.mark.parametrize(
    ("kw", "expect"),
    [
        ({"done": True}, Arrival.USE),
        ({"started_at": 99.5}, Arrival.WAIT),  # 500 ms left < 800 ms recompute
        ({"started_at": 99.0, "done_fraction": 0.1}, Arrival.RECOMPUTE),  # 900 ms left
        ({"started_at": 99.0, "done_fraction": 0.5}, Arrival.WAIT),
        ({"started_at": 99.85}, Arrival.RECOMPUTE),  # 850 ms left > 800 ms
        ({}, Arrival.RECOMPUTE),  # not started, 1000 ms fetch vs 800 ms recompute
        ({"recompute": 2000.0}, Arrival.FETCH),
    ],
    ids=[
        "done-uses",
        "in-flight-nearly-done-waits",
        "reported-progress-slow-recomputes",
        "reported-progress-fast-waits",
        "late-prefetch-never-worse",
        "not-started-recompute-cheaper",
        "not-started-fetch-cheaper",
    ],
)
def test_on_arrival(kw: dict[str, float | bool], expect: Arrival) -> None:
    args = dict(kw)
    recompute = float(args.pop("recompute", 800.0))
    got = on_arrival(NOW, fetch_cost_ms=1000.0, recompute_cost_ms=recompute, **args)  # type: ignore[arg-type]
    assert got is expect


def test_tier_link_of_a_profile_costs_what_the_engine_uses() -> None:
    p = get_profile(DEFAULT_PROFILE)
    assert fetch_ms(8192, p.kv_bytes_per_token, TierLink.of(p)) == pytest.approx(
        p.transfer_ms(8192)
    )
