"""prefix-estimate: one estimate (the larger of the routed and the precise match), one
score; and ttft-cost's decode-contention and KV-pressure terms."""

from __future__ import annotations

import pytest

from services.common.tokens import block_hashes
from services.scheduler.routing.types import Choice, EndpointView, Pick, PrefixMatch
from tests.unit._routing_helpers import ctx, ep, make, req

H = tuple(block_hashes(list(range(1000, 1032)), 4))  # 8 chained blocks of 4 tokens


def _routed(plugin: object, iid: str, blocks: int) -> None:
    pick = Pick(decode=Choice(ep(iid), 0.0), prefill=None, profile="p")
    plugin.on_pick(0.0, req(f"w-{iid}", block_hashes=H[:blocks]), pick)  # type: ignore[attr-defined]


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


def test_prefix_estimate_needs_precise_lookups() -> None:
    """The shell looks up precise matches for a profile holding a prefix-estimate."""
    from services.scheduler.core import EndpointSpec, build_core
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
