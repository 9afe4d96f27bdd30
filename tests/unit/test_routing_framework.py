"""The scheduling cycle: eligibility, filters, weighted scorers, pickers, P/D, post-pick."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

import pytest

from services.common.routing.framework import CycleContext, Profile, Scheduler
from services.common.routing.types import (
    EndpointSnapshot,
    EndpointView,
    NoEndpoint,
    Pick,
    RequestView,
    Shed,
)
from tests.unit._routing_helpers import ep, req


class FixedScorer:
    def __init__(self, name: str, scores: Mapping[str, float]) -> None:
        self.name = name
        self.scores = scores

    def score(
        self, ctx: CycleContext, request: RequestView, candidates: Sequence[EndpointView]
    ) -> Mapping[str, float]:
        return {
            e.instance_id: self.scores[e.instance_id]
            for e in candidates
            if e.instance_id in self.scores
        }


class DropFilter:
    def __init__(self, name: str, drop: set[str], shed: bool = False) -> None:
        self.name = name
        self.drop = drop
        self.shed = shed

    def filter(
        self, ctx: CycleContext, request: RequestView, candidates: Sequence[EndpointView]
    ) -> Sequence[EndpointView] | Shed:
        if self.shed:
            return Shed("nope", 250)
        return [e for e in candidates if e.instance_id not in self.drop]


class Recorder:
    def __init__(self) -> None:
        self.name = "rec"
        self.picks: list[Pick] = []

    def on_pick(self, now: float, request: RequestView, pick: Pick) -> None:
        self.picks.append(pick)


def sched(*profiles: Profile) -> Scheduler:
    return Scheduler({p.name: p for p in profiles}, profiles[0].name, random.Random(1))


ABC = EndpointSnapshot([ep("c"), ep("a"), ep("b")])


@pytest.mark.parametrize(
    ("scorers", "expected"),
    [
        ([], "a"),  # all zero: tie → lowest id
        ([(FixedScorer("s", {"a": 0.1, "b": 0.9, "c": 0.5}), 1.0)], "b"),
        (
            [
                (FixedScorer("s1", {"a": 1.0, "b": 0.0, "c": 0.0}), 1.0),
                (FixedScorer("s2", {"a": 0.0, "b": 1.0, "c": 0.6}), 3.0),
            ],
            "b",
        ),
        (
            [(FixedScorer("s", {"a": 7.0, "b": 1.0, "c": float("nan")}), 1.0)],
            "a",
        ),  # clamp: a=1,b=1 tie
        ([(FixedScorer("s", {"a": -3.0, "b": 0.2}), 1.0)], "b"),  # negative→0, missing c→0
    ],
    ids=["tie-lowest-id", "single-scorer", "weights-multiply", "clamp-and-nan", "negative-missing"],
)
def test_weighted_sum_and_max_score_pick(scorers: list, expected: str) -> None:  # type: ignore[type-arg]
    s = sched(Profile("p", scorers=tuple(scorers)))
    d = s.schedule(req(), ABC, now=0.0)
    assert isinstance(d, Pick) and d.decode.endpoint.instance_id == expected
    assert d.prefill is None and not d.disaggregated


def test_pick_reports_total_and_per_plugin_scores() -> None:
    s = sched(
        Profile(
            "p",
            scorers=(
                (FixedScorer("x", {"a": 0.5, "b": 0.0, "c": 0.0}), 2.0),
                (FixedScorer("y", {"a": 0.25, "b": 0.0, "c": 0.0}), 1.0),
            ),
        )
    )
    d = s.schedule(req(), ABC, now=0.0)
    assert isinstance(d, Pick)
    assert d.decode.score == pytest.approx(1.25)
    assert d.decode.scores == (("x", 0.5, 2.0), ("y", 0.25, 1.0))


@pytest.mark.parametrize(
    ("endpoints", "exclude", "expected"),
    [
        ([ep("a", healthy=False), ep("b")], frozenset(), "b"),
        ([ep("a", draining=True), ep("b")], frozenset(), "b"),
        ([ep("a", circuit="open"), ep("b")], frozenset(), "b"),
        ([ep("a", circuit="half-open"), ep("b")], frozenset(), "a"),
        ([ep("a"), ep("b")], frozenset({"a"}), "b"),
        ([ep("a", role="prefill"), ep("b", role="decode")], frozenset(), "b"),
        ([ep("a", healthy=False), ep("b", draining=True)], frozenset(), None),
        ([ep("a", role="prefill")], frozenset(), None),
    ],
    ids=[
        "unhealthy",
        "draining",
        "circuit-open",
        "half-open-allowed",
        "excluded",
        "prefill-role-not-decode",
        "none-eligible",
        "only-prefill",
    ],
)
def test_eligibility(
    endpoints: list[EndpointView], exclude: frozenset[str], expected: str | None
) -> None:
    s = sched(Profile("p"))
    d = s.schedule(req(exclude=exclude), EndpointSnapshot(endpoints), now=0.0)
    if expected is None:
        assert isinstance(d, NoEndpoint)
    else:
        assert isinstance(d, Pick) and d.decode.endpoint.instance_id == expected


@pytest.mark.parametrize(
    ("filters", "expected"),
    [
        ((DropFilter("f", {"a"}),), "b"),
        ((DropFilter("f1", {"a"}), DropFilter("f2", {"b"})), "c"),
        ((DropFilter("f", {"a", "b", "c"}),), NoEndpoint),
        ((DropFilter("f", set(), shed=True),), Shed),
    ],
    ids=["drop-one", "chained", "emptied", "shed"],
)
def test_filters(filters: tuple[DropFilter, ...], expected: object) -> None:
    s = sched(Profile("p", filters=filters))
    d = s.schedule(req(), ABC, now=0.0)
    if isinstance(expected, str):
        assert isinstance(d, Pick) and d.decode.endpoint.instance_id == expected
    else:
        assert isinstance(d, expected)  # type: ignore[arg-type]


class Always:
    name = "always"

    def __init__(self, answer: bool) -> None:
        self.answer = answer

    def disaggregate(self, ctx: CycleContext, request: RequestView, decode: object) -> bool:
        return self.answer


PD = EndpointSnapshot([ep("p1", role="prefill"), ep("p2", role="prefill"), ep("d1", role="decode")])


@pytest.mark.parametrize(
    ("decider", "snapshot", "prefill"),
    [
        (None, PD, "p2"),
        (Always(True), PD, "p2"),
        (Always(False), PD, None),
        (None, EndpointSnapshot([ep("d1", role="decode")]), None),
        (
            None,
            EndpointSnapshot([ep("p1", role="prefill", healthy=False), ep("d1", role="decode")]),
            None,
        ),
    ],
    ids=[
        "no-decider-disaggregates",
        "decider-yes",
        "decider-no",
        "no-prefill-endpoints",
        "prefill-unhealthy",
    ],
)
def test_pd_runs_prefill_profile_over_prefill_role(
    decider: Always | None, snapshot: EndpointSnapshot, prefill: str | None
) -> None:
    s = sched(
        Profile("d", decider=decider, prefill_profile="p"),  # type: ignore[arg-type]
        Profile("p", scorers=((FixedScorer("s", {"p1": 0.1, "p2": 0.9}), 1.0),)),
    )
    d = s.schedule(req(), snapshot, now=0.0)
    assert isinstance(d, Pick) and d.decode.endpoint.instance_id == "d1"
    assert (d.prefill.endpoint.instance_id if d.prefill else None) == prefill
    assert d.disaggregated == (prefill is not None)


def test_post_pick_sees_final_decision_once_even_if_shared() -> None:
    rec = Recorder()
    s = sched(Profile("d", prefill_profile="p", post_pick=(rec,)), Profile("p", post_pick=(rec,)))
    d = s.schedule(req(), PD, now=3.0)
    assert rec.picks == [d]


def test_shed_skips_post_pick() -> None:
    rec = Recorder()
    s = sched(Profile("p", filters=(DropFilter("f", set(), shed=True),), post_pick=(rec,)))
    assert isinstance(s.schedule(req(), ABC, now=0.0), Shed)
    assert rec.picks == []


def test_unknown_profile_is_key_error_and_default_must_exist() -> None:
    s = sched(Profile("p"))
    with pytest.raises(KeyError):
        s.schedule(req(), ABC, now=0.0, profile="nope")
    with pytest.raises(ValueError, match="default profile"):
        Scheduler({"p": Profile("p")}, "q", random.Random(0))


def test_snapshot_orders_by_id_and_refuses_duplicates() -> None:
    snap = EndpointSnapshot([ep("b"), ep("a")])
    assert [e.instance_id for e in snap] == ["a", "b"] and snap.get("b") is not None
    with pytest.raises(ValueError, match="duplicate"):
        EndpointSnapshot([ep("a"), ep("a")])


@pytest.mark.parametrize(
    ("scores", "weight"),
    [
        ({}, 2.0),  # nothing scored (a session scorer without a session)
        ({"a": 0.0, "b": -0.0}, 5.0),  # zeros, one of them negative zero
        ({"a": 0.0}, 0.0),  # zero weight
    ],
    ids=["empty", "zeros", "zero-weight"],
)
def test_an_all_zero_column_adds_nothing(scores: dict[str, float], weight: float) -> None:
    """A column of zeros after the first leaves every total as it was, and is reported."""
    first = FixedScorer("first", {"a": 0.3, "b": 0.7, "c": 0.7})
    alone = sched(Profile("p", scorers=((first, 3.0),))).schedule(req(), ABC, now=0.0)
    both = sched(Profile("p", scorers=((first, 3.0), (FixedScorer("z", scores), weight))))
    d = both.schedule(req(), ABC, now=0.0)
    assert isinstance(alone, Pick) and isinstance(d, Pick)
    assert d.decode.endpoint.instance_id == alone.decode.endpoint.instance_id == "b"
    assert d.decode.score == alone.decode.score == 3.0 * 0.7
    assert d.decode.scores[1] == ("z", 0.0, weight)
