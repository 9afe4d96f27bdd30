"""Pickers and load plugins: round-robin, random, power-of-two, least-load, load-guard."""

from __future__ import annotations

import random

import pytest

from services.common.routing.framework import Scored
from services.common.routing.types import EndpointView
from tests.unit._routing_helpers import ctx, ep, make, req


def scored(*pairs: tuple[str, float]) -> list[Scored]:
    return [Scored(ep(i), s, ()) for i, s in pairs]


def test_round_robin_cycles_in_id_order() -> None:
    rr = make("round-robin")
    c, r = ctx(), req()
    cands = scored(("a", 0.0), ("b", 9.0), ("c", 0.0))
    assert [rr.pick(c, r, cands).endpoint.instance_id for _ in range(5)] == [
        "a",
        "b",
        "c",
        "a",
        "b",
    ]


def test_random_is_deterministic_given_seed_and_covers_all() -> None:
    rnd = make("random")
    cands = scored(("a", 0.0), ("b", 0.0), ("c", 0.0))
    c1, c2 = ctx(seed=7), ctx(seed=7)
    seq1 = [rnd.pick(c1, req(), cands).endpoint.instance_id for _ in range(30)]
    seq2 = [rnd.pick(c2, req(), cands).endpoint.instance_id for _ in range(30)]
    assert seq1 == seq2 and set(seq1) == {"a", "b", "c"}


@pytest.mark.parametrize(
    ("cands", "forbidden"),
    [
        (scored(("a", 0.1), ("b", 0.5), ("c", 0.9)), "a"),  # the worst never wins a pair
        (scored(("a", 0.9), ("b", 0.1)), "b"),
    ],
    ids=["three", "two"],
)
def test_power_of_two_never_picks_the_worst_of_its_pair(
    cands: list[Scored], forbidden: str
) -> None:
    p2c = make("power-of-two")
    c = ctx(seed=3)
    picks = {p2c.pick(c, req(), cands).endpoint.instance_id for _ in range(50)}
    assert forbidden not in picks and len(picks) >= 1


def test_power_of_two_single_candidate() -> None:
    assert make("power-of-two").pick(ctx(), req(), scored(("a", 0.0))).endpoint.instance_id == "a"


def test_max_score_random_ties_uses_rng() -> None:
    ms = make("max-score", random_ties=True)
    c = ctx(seed=1)
    cands = scored(("a", 1.0), ("b", 1.0), ("c", 0.5))
    picks = {ms.pick(c, req(), cands).endpoint.instance_id for _ in range(40)}
    assert picks == {"a", "b"}


@pytest.mark.parametrize(
    ("endpoints", "params", "expected"),
    [
        ([ep("a"), ep("b")], {}, {"a": 1.0, "b": 1.0}),
        (
            [ep("a", waiting=4), ep("b", waiting=2)],
            {"running": 0, "tokens_in_flight": 0, "kv_usage": 0},
            {"a": 0.0, "b": 0.5},
        ),
        (
            [ep("a", waiting=1, reserved_requests=3), ep("b", waiting=4)],
            {"running": 0, "tokens_in_flight": 0, "kv_usage": 0},
            {"a": 0.0, "b": 0.0},
        ),
        (
            [ep("a", kv_usage=0.8), ep("b", kv_usage=0.2)],
            {"waiting": 0, "running": 0, "tokens_in_flight": 0},
            {"a": 0.0, "b": 0.75},
        ),
        (
            [ep("a", tokens_in_flight=100, reserved_tokens=100), ep("b", tokens_in_flight=50)],
            {"waiting": 0, "running": 0, "kv_usage": 0},
            {"a": 0.0, "b": 0.75},
        ),
        (
            [ep("a", waiting=2, running=4), ep("b", waiting=1, running=8)],
            {"waiting": 1, "running": 1, "tokens_in_flight": 0, "kv_usage": 0},
            {"a": 0.25, "b": 0.25},
        ),
        ([ep("a", waiting=3)], {}, {"a": 1 - 1 / 3.5}),
        (
            [ep("a", waiting=3)],
            {"waiting": 0, "running": 0, "tokens_in_flight": 0, "kv_usage": 0},
            {"a": 1.0},
        ),
    ],
    ids=[
        "idle",
        "waiting",
        "reservations-count",
        "kv",
        "reserved-tokens",
        "mixed",
        "single",
        "all-zero-weights",
    ],
)
def test_least_load(
    endpoints: list[EndpointView], params: dict[str, float], expected: dict[str, float]
) -> None:
    got = make("least-load", **params).score(ctx(), req(), endpoints)
    assert got == pytest.approx(expected)


@pytest.mark.parametrize(
    ("loads", "params", "kept"),
    [
        ([0, 5, 30], {"abs_threshold": 16, "rel_threshold": 1.5}, ["a", "b"]),
        ([10, 20, 30], {"abs_threshold": 16, "rel_threshold": 1.5}, ["a", "b"]),  # 20>16 and 30>15
        (
            [20, 30, 38],
            {"abs_threshold": 16, "rel_threshold": 2.0},
            ["a", "b", "c"],
        ),  # abs passes, rel not
        (
            [0, 0, 10],
            {"abs_threshold": 16, "rel_threshold": 1.5},
            ["a", "b", "c"],
        ),  # rel passes, abs not
        ([5], {"abs_threshold": 0, "rel_threshold": 1.0}, ["a"]),
    ],
    ids=["hot-removed", "both-exceeded", "rel-not-exceeded", "abs-not-exceeded", "single"],
)
def test_load_guard(loads: list[int], params: dict[str, float], kept: list[str]) -> None:
    eps = [ep(chr(ord("a") + i), waiting=n) for i, n in enumerate(loads)]
    out = make("load-guard", **params).filter(ctx(), req(), eps)
    assert [e.instance_id for e in out] == kept


def test_load_guard_token_metric() -> None:
    eps = [ep("a", tokens_in_flight=100), ep("b", tokens_in_flight=10_000, waiting=0)]
    out = make("load-guard", metric="tokens", abs_threshold=1000).filter(ctx(), req(), eps)
    assert [e.instance_id for e in out] == ["a"]


def test_rng_is_the_only_randomness() -> None:
    rnd = make("random")
    cands = scored(("a", 0.0), ("b", 0.0))
    c = ctx()
    c.rng = random.Random(42)
    first = [rnd.pick(c, req(), cands).endpoint.instance_id for _ in range(10)]
    c.rng = random.Random(42)
    assert [rnd.pick(c, req(), cands).endpoint.instance_id for _ in range(10)] == first
