"""Cached fleet snapshots (patched per changed view) always equal a snapshot built from
scratch, whatever sequence of membership, load, health, drain and reservation changes."""

from __future__ import annotations

import random

import pytest

from services.common.routing.types import EndpointSnapshot, EndpointView
from services.common.scheduling.fleet import EndpointSpec, Fleet, LoadReport

IDS = ["a", "b", "c", "d", "e"]


def _fresh(f: Fleet, now: float, deployment: str) -> EndpointSnapshot:
    views = [
        f._build(i, now)[0]
        for i in f.ids()
        if not deployment or f.spec(i).deployment in ("", deployment)
    ]
    return EndpointSnapshot(views)


def _step(f: Fleet, rng: random.Random, now: float, picks: list[str], k: int) -> None:
    iid = rng.choice(IDS)
    op = rng.randrange(10)
    if op == 0:
        f.upsert(
            EndpointSpec(
                iid,
                f"http://{iid}",
                rng.choice(["worker", "prefill", "decode"]),
                deployment=rng.choice(["", "d1", "d2"]),
            ),
        )
    elif op == 1:
        f.retire(iid)
    elif op == 2 and iid in f:
        f.report_load(iid, LoadReport(waiting=rng.randrange(5), running=rng.randrange(5)), now,
                      source=rng.choice(["scrape", "stream"]))  # fmt: skip
    elif op == 3:
        f.probe(iid, rng.random() < 0.5, now)
    elif op == 4:
        f.upstream_result(iid, rng.random() < 0.4, now)
    elif op == 5 and iid in f:
        f.set_draining(iid, rng.random() < 0.3)
    elif op == 6:
        pid = f"p{k}"
        f.reserve(pid, [iid, rng.choice(IDS)], {iid: rng.randrange(100)}, now)
        picks.append(pid)
    elif op == 7 and picks:
        f.release(picks.pop(rng.randrange(len(picks))))
    elif op == 8 and picks:
        f.first_token(rng.choice(picks))
    else:
        f.set_remote_in_flight({iid: (rng.randrange(3), rng.randrange(50))})


@pytest.mark.parametrize("seed", range(6), ids=[f"seed{s}" for s in range(6)])
def test_cached_snapshot_equals_fresh_build(seed: int) -> None:
    rng = random.Random(seed)
    f = Fleet(breaker_failures=1, breaker_open_s=2.0, load_stale_s=3.0, stream_stale_s=1.0)
    for iid in IDS[:3]:
        f.upsert(EndpointSpec(iid, f"http://{iid}"))
    now, picks = 0.0, list[str]()
    for k in range(400):
        now += rng.choice([0.0, 0.0, 0.1, 0.7, 1.5])
        _step(f, rng, now, picks, k)
        for dep in ("", "d1"):
            got, want = f.snapshot(now, dep), _fresh(f, now, dep)
            assert list(got) == list(want), (k, dep)
            assert got.pools() == want.pools(), (k, dep)
            n, decode, prefill = want.pools()
            assert got.pool_sizes() == (n, len(decode), len(prefill)), (k, dep)
            assert all(got.get(e.instance_id) == e for e in want), (k, dep)


@pytest.mark.parametrize(
    ("views", "positions"),
    [
        ([EndpointView("a"), EndpointView("b"), EndpointView("c")], [0, 2]),
        ([EndpointView("a"), EndpointView("b", healthy=False), EndpointView("c")], [1, 2]),
        ([EndpointView("a", role="prefill"), EndpointView("b"), EndpointView("c")], [0, 1]),
        ([EndpointView("a", circuit="open"), EndpointView("b", draining=True)], [0, 1]),
        ([EndpointView("a"), EndpointView("b")], []),
    ],
    ids=["all-eligible", "unhealthy", "prefill", "none-eligible", "empty"],
)
def test_subset_equals_fresh_build(views: list[EndpointView], positions: list[int]) -> None:
    whole = EndpointSnapshot(views, version=7)
    whole.pools()  # the subset derives its pools from these
    got = whole.subset(positions)
    want = EndpointSnapshot([views[i] for i in positions], version=7)
    assert list(got) == list(want)
    assert got.pools() == want.pools()
    n, decode, prefill = want.pools()
    assert got.pool_sizes() == (n, len(decode), len(prefill))
    assert got.version == 7
    assert all(got.get(e.instance_id) is e for e in want)
