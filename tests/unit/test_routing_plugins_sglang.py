"""sglang-router's cache_aware decision as a filter (the simulator's baseline)."""

from __future__ import annotations

import pytest

from services.common.routing.types import EndpointView
from tests.unit._routing_helpers import ctx, ep, make, req


@pytest.mark.parametrize(
    ("loads", "cached", "want"),
    [
        # imbalanced (70 - 2 > 64 and 70 > 1.5 * 2): shortest queue, whatever is cached
        ({"a": 70, "b": 2, "c": 5}, {"a": 16}, "b"),
        # balanced, match 12/16 > 0.3: the best match even though it is the busiest
        ({"a": 30, "b": 2, "c": 5}, {"a": 12, "c": 4}, "a"),
        # balanced, match 4/16 <= 0.3: the least loaded
        ({"a": 3, "b": 2, "c": 5}, {"a": 4}, "b"),
        # abs difference above 64 but the max not 1.5x the min: balanced, the match wins
        ({"a": 200, "b": 140}, {"a": 16}, "a"),
        # equal loads, no match: the first
        ({"a": 1, "b": 1}, {}, "a"),
    ],
    ids=["imbalanced-least-load", "match-wins", "weak-match-least-load", "rel-balanced", "tie"],
)
def test_cache_aware_decision(loads: dict[str, int], cached: dict[str, int], want: str) -> None:
    f = make("sglang-cache-aware")
    c = ctx()
    c.cached_tokens.update(cached)
    cands: list[EndpointView] = [ep(i, running=n) for i, n in loads.items()]
    out = f.filter(c, req(prompt_tokens=16), cands)
    assert [e.instance_id for e in out] == [want]


def test_single_candidate_is_kept() -> None:
    f = make("sglang-cache-aware")
    assert [e.instance_id for e in f.filter(ctx(), req(), [ep("a")])] == ["a"]
