"""Prefix plugins: routed-prefix index (TTL, LRU, stride), approx and precise scorers."""

from __future__ import annotations

import pytest

from services.common.routing.plugins.routed_index import RoutedPrefixIndex
from services.common.routing.types import Choice, EndpointView, Pick, PrefixMatch
from services.common.tokens import block_hashes
from tests.unit._routing_helpers import ctx, ep, make, req

H = block_hashes(list(range(1000, 1032)), 4)  # 8 chained blocks
OTHER = block_hashes(list(range(2000, 2032)), 4)


def _pick(decode: str, prefill: str | None = None) -> Pick:
    return Pick(
        decode=Choice(ep(decode), 0.0),
        prefill=Choice(ep(prefill, role="prefill"), 0.0) if prefill else None,
        profile="p",
    )


@pytest.mark.parametrize(
    ("inserts", "query", "now", "expected"),
    [
        ([], H, 0.0, {}),
        ([(H, "a", 0.0)], H, 1.0, {"a": 8}),
        ([(H[:3], "a", 0.0)], H, 1.0, {"a": 3}),
        ([(H, "a", 0.0), (H[:5], "b", 0.0)], H, 1.0, {"a": 8, "b": 5}),
        ([(H, "a", 0.0)], H[:2], 1.0, {"a": 2}),
        ([(H, "a", 0.0)], OTHER, 1.0, {}),
        ([(H, "a", 0.0)], H, 11.0, {}),  # ttl 10 s expired
        ([(H, "a", 0.0), (H, "a", 9.0)], H, 15.0, {"a": 8}),  # refreshed
        ([(H, "a", 0.0), (H[:2], "b", 5.0)], H, 12.0, {"b": 2}),
    ],
    ids=[
        "empty",
        "full",
        "partial",
        "two-instances",
        "short-query",
        "different-chain",
        "expired",
        "refreshed",
        "one-expired",
    ],
)
def test_index_match(
    inserts: list[tuple[list[int], str, float]],
    query: list[int],
    now: float,
    expected: dict[str, int],
) -> None:
    idx = RoutedPrefixIndex(ttl_s=10.0, max_entries=1000)
    for hs, iid, t in inserts:
        idx.insert(hs, iid, t)
    assert idx.match(query, now) == expected


def test_index_lru_bound_evicts_least_recently_routed() -> None:
    idx = RoutedPrefixIndex(ttl_s=100.0, max_entries=10)
    idx.insert(H, "a", 0.0)  # 8 entries
    idx.insert(OTHER[:4], "b", 1.0)  # 12 > 10: the two oldest of H go
    assert len(idx) == 10
    assert idx.match(H, 2.0) == {}  # chain broken at block 0
    assert idx.match(OTHER, 2.0) == {"b": 4}


def test_index_stride_indexes_every_kth_block() -> None:
    idx = RoutedPrefixIndex(ttl_s=100.0, max_entries=1000, stride=4)
    idx.insert(H, "a", 0.0)
    assert len(idx) == 2
    assert idx.match(H, 0.0) == {"a": 8}
    assert idx.match(H[:6], 0.0) == {"a": 4}


def test_index_remove_instance() -> None:
    idx = RoutedPrefixIndex(ttl_s=100.0, max_entries=1000)
    idx.insert(H, "a", 0.0)
    idx.insert(H, "b", 0.0)
    assert idx.remove_instance("a") == 8
    assert idx.match(H, 0.0) == {"b": 8}


def test_approx_prefix_scores_and_learns_from_picks() -> None:
    ap = make("approx-prefix", ttl_s=60)
    r = req(prompt_tokens=32, block_hashes=tuple(H))
    eps = [ep("a"), ep("b"), ep("p", role="prefill")]
    assert ap.score(ctx(), r, eps) == {"a": 0.0, "b": 0.0, "p": 0.0}
    ap.on_pick(1.0, r, _pick("b", prefill="p"))
    c = ctx(now=2.0)
    r2 = req("r2", prompt_tokens=16, block_hashes=tuple(H[:4]) + tuple(OTHER[:4]))
    assert ap.score(c, r2, eps) == {"a": 0.0, "b": 0.5, "p": 0.5}
    ap.prepare(c, r2, eps)
    assert c.cached_tokens == {"b": 16, "p": 16}
    ap.forget("b")
    assert ap.score(ctx(now=3.0), r2, eps) == {"a": 0.0, "b": 0.0, "p": 0.5}


def test_approx_prefix_threshold_zeroes_small_matches() -> None:
    ap = make("approx-prefix", threshold=0.5)
    ap.on_pick(0.0, req(block_hashes=tuple(H[:3])), _pick("a"))
    r = req(block_hashes=tuple(H))
    assert ap.score(ctx(), r, [ep("a")]) == {"a": 0.0}  # 3/8 < 0.5
    ap.on_pick(0.0, req(block_hashes=tuple(H[:4])), _pick("a"))
    assert ap.score(ctx(), r, [ep("a")]) == {"a": 0.5}


def test_approx_prefix_no_blocks_scores_nothing() -> None:
    ap = make("approx-prefix")
    assert ap.score(ctx(), req(prompt_tokens=3), [ep("a")]) == {}


@pytest.mark.parametrize(
    ("matches", "weights", "expected_scores", "expected_cached"),
    [
        (None, None, {"a": 0.0, "b": 0.0}, {}),
        ({"a": PrefixMatch(4)}, None, {"a": 0.5, "b": 0.0}, {"a": 16}),
        ({"a": PrefixMatch(8, {"gpu": 4, "cpu": 4})}, None, {"a": 0.9, "b": 0.0}, {"a": 28}),
        ({"a": PrefixMatch(8, {"ssd": 8})}, {"ssd": 0.25}, {"a": 0.25, "b": 0.0}, {"a": 8}),
        ({"a": PrefixMatch(8, {"remote": 8})}, {"gpu": 1.0}, {"a": 0.0, "b": 0.0}, {"a": 0}),
        ({"b": PrefixMatch(2), "z": PrefixMatch(8)}, None, {"a": 0.0, "b": 0.25}, {"b": 8}),
    ],
    ids=[
        "no-lookup",
        "gpu-default",
        "tier-weighted",
        "custom-weights",
        "unweighted-tier",
        "non-candidate-ignored",
    ],
)
def test_precise_prefix(
    matches: dict[str, PrefixMatch] | None,
    weights: dict[str, float] | None,
    expected_scores: dict[str, float],
    expected_cached: dict[str, int],
) -> None:
    pp = make("precise-prefix", **({"tier_weights": weights} if weights else {}))
    r = req(prompt_tokens=32, block_hashes=tuple(H), prefix_matches=matches)
    eps: list[EndpointView] = [ep("a"), ep("b")]
    c = ctx()
    pp.prepare(c, r, eps)
    assert pp.score(c, r, eps) == pytest.approx(expected_scores)
    assert {k: v for k, v in c.cached_tokens.items()} == {
        k: v for k, v in expected_cached.items() if v
    }


@pytest.mark.parametrize(
    ("routed", "query", "blocks"),
    [
        (6, 6, 6),  # the exact end of a routed prompt, not rounded down to the stride
        (6, 10, 6),  # the next turn extends it: known to the block
        (3, 3, 3),  # shorter than the stride: only its tip is indexed
        (3, 2, 0),  # a shorter query than the tip: its blocks were not indexed
        (8, 8, 8),  # on the stride: no tip needed
        (9, 7, 4),  # between strided positions of a longer prompt: the stride's granularity
    ],
    ids=["tip", "extended", "short", "under-tip", "on-stride", "inside"],
)
def test_routed_index_knows_tips(routed: int, query: int, blocks: int) -> None:
    chain = list(range(100, 120))
    idx = RoutedPrefixIndex(ttl_s=60.0, max_entries=1000, stride=4)
    idx.insert(chain[:routed], "a", 0.0)
    assert idx.match(chain[:query], 1.0) == ({"a": blocks} if blocks else {})


@pytest.mark.parametrize(
    ("rid", "now", "same"),
    [
        pytest.param("r2", 2.0, True, id="same-request-and-time"),
        pytest.param("other", 2.0, False, id="other-request"),
        pytest.param("r2", 2.5, False, id="later"),
    ],
)
def test_approx_prefix_lookup_is_the_cycles_own(rid: str, now: float, same: bool) -> None:
    """A lookup just before a cycle (the simulator's diagnostics) is the one the cycle uses
    when the request and time agree; else the cycle looks the index up itself."""
    ap = make("approx-prefix", ttl_s=60)
    ap.on_pick(1.0, req(prompt_tokens=32, block_hashes=tuple(H)), _pick("b"))
    r2 = req("r2", prompt_tokens=32, block_hashes=tuple(H))
    before = ap.lookup(rid, r2.block_hashes, now)
    assert before == {"b": 8}
    c = ctx(now=2.0)
    ap.prepare(c, r2, [ep("a"), ep("b")])
    assert c.cached_tokens == {"b": 32}
    assert (ap.lookup("r2", r2.block_hashes, 2.0) is before) is same
