"""sglang-router's cache_aware decision as a filter (the simulator's baseline)."""

from __future__ import annotations

import pytest

from services.scheduler.routing.types import Choice, EndpointView, Pick
from tests.unit._routing_helpers import ctx, ep, make, req


def pick_of(iid: str) -> Pick:
    return Pick(decode=Choice(ep(iid), 0.0), prefill=None, profile="cache_aware")


@pytest.mark.parametrize(
    ("loads", "cached", "tree", "want"),
    [
        # imbalanced (70 - 2 > 64 and 70 > 1.5 * 2): shortest queue, whatever is cached
        ({"a": 70, "b": 2, "c": 5}, {"a": 16}, {}, "b"),
        # balanced, match 12/16 > 0.3: the best match even though it is the busiest
        ({"a": 30, "b": 2, "c": 5}, {"a": 12, "c": 4}, {}, "a"),
        # balanced, match 4/16 <= 0.3: the smallest routed history, not the least loaded
        ({"a": 3, "b": 2, "c": 5}, {"a": 4}, {"a": 9, "b": 7, "c": 1}, "c"),
        # abs difference above 64 but max not 1.5x min: balanced
        ({"a": 200, "b": 140}, {"a": 16}, {}, "a"),
    ],
    ids=["imbalanced-least-load", "match-wins", "weak-match-smallest-tree", "rel-balanced"],
)
def test_cache_aware_decision(
    loads: dict[str, int], cached: dict[str, int], tree: dict[str, int], want: str
) -> None:
    f = make("sglang-cache-aware")
    f.tree_blocks.update(tree)
    c = ctx()
    c.cached_tokens.update(cached)
    cands: list[EndpointView] = [ep(i, running=n) for i, n in loads.items()]
    out = f.filter(c, req(prompt_tokens=16), cands)
    assert [e.instance_id for e in out] == [want]


@pytest.mark.parametrize(
    ("cached_on_target", "added"),
    [(0, 4), (8, 2), (16, 0)],
    ids=["new", "half-held", "all-held"],
)
def test_pick_grows_the_tree_by_the_blocks_not_held(cached_on_target: int, added: int) -> None:
    f = make("sglang-cache-aware")
    c = ctx()
    c.cached_tokens["a"] = cached_on_target
    r = req(prompt_tokens=16, block_hashes=(1, 2, 3, 4))  # block_size 4: 4 blocks
    f.filter(c, r, [ep("a"), ep("b")])
    f.on_pick(0.0, r, pick_of("a"))
    assert f.tree_blocks.get("a", 0) == added


def test_single_candidate_is_kept() -> None:
    f = make("sglang-cache-aware")
    assert [e.instance_id for e in f.filter(ctx(), req(), [ep("a")])] == ["a"]
