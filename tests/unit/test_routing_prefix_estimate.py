"""prefix-estimate: one estimate (the larger of the routed and the precise match), one
score; and ttft-cost's decode-contention and KV-pressure terms."""

from __future__ import annotations

import pytest

from services.common.routing.types import Choice, EndpointView, Pick, PrefixMatch
from services.common.tokens import block_hashes
from tests.unit._routing_helpers import ctx, ep, make, req

H = tuple(block_hashes(list(range(1000, 1032)), 4))  # 8 chained blocks of 4 tokens


def _routed(plugin: object, iid: str, blocks: int) -> None:
    """A pick of ``blocks`` of H on ``iid`` that has answered."""
    pick = Pick(decode=Choice(ep(iid), 0.0), prefill=None, profile="p")
    r = req(f"w-{iid}", block_hashes=H[:blocks])
    plugin.on_pick(0.0, r, pick)  # type: ignore[attr-defined]
    plugin.on_settle(r, pick, True)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("routed", "precise", "params", "expected"),
    [
        ({}, None, {}, {"a": 0.0, "b": 0.0}),
        ({"a": 8}, None, {}, {"a": 1.0, "b": 0.0}),
        ({}, {"a": PrefixMatch(4, {"gpu": 4})}, {}, {"a": 0.5, "b": 0.0}),
        ({"a": 8}, {"a": PrefixMatch(4, {"gpu": 4})}, {}, {"a": 1.0, "b": 0.0}),
        ({"a": 2}, {"b": PrefixMatch(6, {"gpu": 6})}, {}, {"a": 0.25, "b": 0.75}),
        ({"a": 4}, {"a": PrefixMatch(6, {"cpu": 6})}, {}, {"a": 19 / 32, "b": 0.0}),  # 4.8 blocks
        ({"a": 2}, {"b": PrefixMatch(6, {"gpu": 6})}, {"threshold": 0.5}, {"a": 0.0, "b": 0.75}),
    ],
    ids=[
        "nothing-known",
        "routed-only",
        "precise-only",
        "both-counted-once-not-summed",
        "larger-of-the-two-per-instance",
        "precise-tier-weighted-beats-shorter-routed",
        "threshold",
    ],
)
def test_prefix_estimate(
    routed: dict[str, int],
    precise: dict[str, PrefixMatch] | None,
    params: dict[str, float],
    expected: dict[str, float],
) -> None:
    pe = make("prefix-estimate", **params)
    for iid, blocks in routed.items():
        _routed(pe, iid, blocks)
    r = req(prompt_tokens=32, block_hashes=H, prefix_matches=precise)
    eps: list[EndpointView] = [ep("a"), ep("b")]
    c = ctx(now=1.0)
    pe.prepare(c, r, eps)
    assert pe.score(c, r, eps) == pytest.approx(expected)
    assert pe.score_list(c, r, eps) == pytest.approx([expected["a"], expected["b"]])


# Carriers: (instance, blocks of H, how the pick ended: None = no answer yet, True =
# answered, False = failed before its first byte).
Carrier = tuple[str, int, bool | None]
ON = {"unfinished": True}


@pytest.mark.parametrize(
    ("carriers", "precise", "params", "expected_cached", "expected_ready"),
    [
        ([("a", 8, None)], None, ON, {"a": 32, "b": 0}, {"a": 0, "b": 0}),
        ([("a", 8, True)], None, ON, {"a": 32, "b": 0}, {"a": 32, "b": 0}),
        ([("a", 8, False)], None, ON, {"a": 0, "b": 0}, {"a": 0, "b": 0}),
        ([("a", 4, True), ("a", 8, None)], None, ON, {"a": 32, "b": 0}, {"a": 16, "b": 0}),
        ([("a", 8, None), ("b", 2, True)], None, ON, {"a": 32, "b": 8}, {"a": 0, "b": 8}),
        (
            [("a", 8, None)],
            {"a": PrefixMatch(6, {"gpu": 6})},
            ON,
            {"a": 32, "b": 0},
            {"a": 24, "b": 0},
        ),
        ([("a", 8, None)], None, {}, {"a": 32, "b": 0}, {"a": 32, "b": 0}),
    ],
    ids=[
        "prefilling-carrier-where-not-cached-yet",
        "answered-carrier-cached",
        "failed-carrier-nowhere",
        "answered-part-ready-prefilling-rest-not",
        "prefilling-long-vs-answered-short-elsewhere",
        "engine-reported-blocks-are-ready",
        "off-by-default-counts-all-as-sglang-router",
    ],
)
def test_prefix_estimate_unfinished_carriers(
    carriers: list[Carrier],
    precise: dict[str, PrefixMatch] | None,
    params: dict[str, bool],
    expected_cached: dict[str, int],
    expected_ready: dict[str, int],
) -> None:
    """A routed prompt is where its prefix will be from the pick on (cached_tokens: score,
    placement), but cached there only once its carrier answered (ready_cached: the
    predicted TTFT): an engine commits a prompt's KV when its prefill ends."""
    pe = make("prefix-estimate", **params)
    for k, (iid, blocks, outcome) in enumerate(carriers):
        pick = Pick(decode=Choice(ep(iid), 0.0), prefill=None, profile="p")
        r = req(f"c{k}", block_hashes=H[:blocks])
        pe.on_pick(float(k), r, pick)
        if outcome is not None:
            pe.on_settle(r, pick, outcome)
    r = req("next", prompt_tokens=32, block_hashes=H, prefix_matches=precise)
    c = ctx(now=10.0)
    pe.prepare(c, r, [ep("a"), ep("b")])
    assert {i: c.cached_tokens.get(i, 0) for i in ("a", "b")} == expected_cached
    assert {i: c.ready_cached(i, 32) for i in ("a", "b")} == expected_ready


@pytest.mark.parametrize(
    ("answered", "expected_ttft"),
    [(False, {"a": 5600.0, "b": 3200.0}), (True, {"a": 800.0, "b": 3200.0})],
    ids=["prefilling-carrier-own-queue-plus-recompute", "answered-carrier-cache-hit"],
)
def test_ttft_follower_of_prefilling_carrier(
    answered: bool, expected_ttft: dict[str, float]
) -> None:
    """The next turn of a session whose previous turn still prefills on ``a``: its
    predicted TTFT there is the wait for that prefill plus its own full prefill (it
    recomputes), not the cache hit it gets once the predecessor answered."""
    pe = make("prefix-estimate", unfinished=True)
    cost = make("ttft-cost", epsilon_ms=1e-6)
    pick = Pick(decode=Choice(ep("a"), 0.0), prefill=None, profile="p")
    prev = req("prev", prompt_tokens=24_000, block_hashes=H[:6], block_size=4_000)
    pe.on_pick(0.0, prev, pick)
    # LinearModel: 0.1 ms per uncached token, 10k tokens/s; the predecessor's 24k tokens
    # are queued on a (reserved until its first token) unless it answered
    a = ep("a") if answered else ep("a", reserved_tokens=24_000, reserved_requests=1)
    if answered:
        pe.on_settle(prev, pick, True)
    r = req("next", prompt_tokens=32_000, block_hashes=H, block_size=4_000)
    c = ctx(now=1.0)
    eps = [a, ep("b")]
    pe.prepare(c, r, eps)
    cost.prepare(c, r, eps)
    assert c.predicted_ttft_ms == pytest.approx(expected_ttft)


def test_prefix_estimate_needs_precise_lookups() -> None:
    """The shell looks up precise matches for a profile holding a prefix-estimate."""
    from services.common.scheduling import EndpointSpec, build_core
    from services.scheduler.feeds.kvmeta_client import precise_profiles

    core = build_core([EndpointSpec("a", "http://a")], seed=0)
    assert "" in precise_profiles(core.scheduler)


# LinearModel: own prefill 0.1 ms per uncached token; prompt 1000 -> 100 ms.
@pytest.mark.parametrize(
    ("params", "endpoints", "max_tokens", "expected_cost"),
    [
        ({"decode": 1.0}, [ep("a"), ep("b", running=4)], 0, {"a": 100.0, "b": 500.0}),
        (
            {"decode": 0.5},
            [ep("a", reserved_requests=2), ep("b", running=4)],
            0,
            {"a": 200.0, "b": 300.0},
        ),
        ({}, [ep("a"), ep("b", running=4)], 0, {"a": 100.0, "b": 100.0}),
        (
            {"kv_pressure": 1.0, "kv_capacity_tokens": 10_000},
            [ep("a", kv_usage=0.5), ep("b", kv_usage=0.9)],
            1000,
            {"a": 100.0, "b": 200.0},
        ),
        (
            {"kv_pressure": 2.0, "kv_capacity_tokens": 10_000},
            [ep("a", kv_usage=0.75), ep("b", kv_usage=0.81)],
            1000,
            {"a": 100.0, "b": 300.0},
        ),
        ({"kv_pressure": 1.0}, [ep("a", kv_usage=0.99)], 1000, {"a": 100.0}),
    ],
    ids=[
        "decode-running-times-own-prefill",
        "decode-counts-unreported-picks",
        "decode-off",
        "kv-does-not-fit",
        "kv-boundary",
        "kv-capacity-unknown-off",
    ],
)
def test_ttft_cost_decode_and_kv_terms(
    params: dict[str, float],
    endpoints: list[EndpointView],
    max_tokens: int,
    expected_cost: dict[str, float],
) -> None:
    cost = make("ttft-cost", epsilon_ms=1e-6, **params)
    r = req(prompt_tokens=1000, max_tokens=max_tokens)
    c = ctx()
    cost.prepare(c, r, endpoints)
    lo = min(expected_cost.values())
    assert cost.score(c, r, endpoints) == pytest.approx(
        {k: lo / v for k, v in expected_cost.items()}, rel=1e-6
    )
    # the request's own predicted TTFT is not the ranking cost
    assert all(v == pytest.approx(100.0) for v in c.predicted_ttft_ms.values())
