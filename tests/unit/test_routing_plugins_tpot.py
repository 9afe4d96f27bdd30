"""The decode-tpot scorer: the TPOT a prefill adds to the decodes batched with it."""

from __future__ import annotations

from typing import Any

import pytest

from services.common.routing.config import ConfigError, load_config
from services.common.routing.plugins.tpot import DecodeTPOTParams, stall_ms_per_token
from services.common.routing.types import EndpointView
from tests.unit._routing_helpers import ENV, ctx, ep, make, req

# Each case: endpoints, the prompt's cached tokens per endpoint, its own prefill (ms) by
# cached tokens as a ttft-cost plugin would record it (empty: no cost plugin), the scorer's
# params, and the expected scores. The prompt is 10,000 tokens; eps is 50 ms.
CASES: list[tuple[str, list[EndpointView], dict[str, int], dict[int, float], dict[str, Any],
                  dict[str, float]]] = [
    # no decodes anywhere: nothing to stall
    ("idle-fleet-scores-equal", [ep("a"), ep("b")], {}, {0: 1000.0}, {},
     {"a": 1.0, "b": 1.0}),
    ("no-cost-plugin-scores-equal", [ep("a", running=10), ep("b")], {}, {}, {},
     {"a": 1.0, "b": 1.0}),
    # 1 s of prefill over 256 tokens per decode (no tokens in flight reported): 3.9 ms
    # each; 10 decodes 39 + 50, 2 decodes 7.8 + 50
    ("fewer-decodes-stall-less", [ep("a", running=10), ep("b", running=2)], {}, {0: 1000.0},
     {}, {"a": 0.650, "b": 1.0}),
    # 4 decodes with 1000 tokens left each: 1 ms each; with 64 left: 15.6 ms each
    ("long-remaining-decodes-absorb-the-stall",
     [ep("a", running=4, tokens_in_flight=4000), ep("b", running=4, tokens_in_flight=256)],
     {}, {0: 1000.0}, {}, {"a": 1.0, "b": 0.480}),
    # the remaining tokens exclude the prefill still queued, floored at min_remaining
    ("queued-prefill-is-not-decode-left",
     [ep("a", running=4, tokens_in_flight=10_008, pending_prefill_tokens=10_000),
      ep("b", running=4, tokens_in_flight=4000)],
     {}, {0: 1000.0}, {}, {"a": 0.180, "b": 1.0}),
    # waiting requests and this gateway's unreported picks decode while it prefills
    ("queued-requests-count-as-decodes",
     [ep("a", running=2, waiting=6, reserved_requests=2), ep("b", running=5)],
     {}, {0: 1000.0}, {}, {"a": 0.781, "b": 1.0}),
    ("queued-requests-ignored-when-off",
     [ep("a", running=2, waiting=6, reserved_requests=2), ep("b", running=5)],
     {}, {0: 1000.0}, {"count_queued": False}, {"a": 1.0, "b": 0.831}),
    # the prompt is cached on a (100 ms of suffix left): it stalls a's decodes far less
    ("a-cached-prompt-stalls-less", [ep("a", running=10), ep("b", running=2)],
     {"a": 9000}, {9000: 100.0, 0: 1000.0}, {}, {"a": 1.0, "b": 0.932}),
    # with a gate of 500 ms, a prompt that prefills in 100 ms somewhere has no say
    ("short-prefill-somewhere-is-left-to-others", [ep("a", running=10), ep("b", running=2)],
     {"a": 9000}, {9000: 100.0, 0: 1000.0}, {"min_prefill_ms": 500.0},
     {"a": 1.0, "b": 1.0}),
    ("long-prefill-everywhere-passes-the-gate", [ep("a", running=10), ep("b", running=2)],
     {}, {0: 1000.0}, {"min_prefill_ms": 500.0}, {"a": 0.650, "b": 1.0}),
    # spread_ms: the lead is the stall spared, not the ratio. 8 s of prefill is 31.25 ms per
    # decode: one decode against two is a ratio of 0.72, but only 31.25 ms spared (of 500)
    ("ratio-gives-near-idle-a-large-lead", [ep("a", running=1), ep("b", running=2)],
     {}, {0: 8000.0}, {}, {"a": 1.0, "b": 0.722}),
    ("spread-gives-near-idle-a-small-lead", [ep("a", running=1), ep("b", running=2)],
     {}, {0: 8000.0}, {"spread_ms": 500.0}, {"a": 1.0, "b": 0.9375}),
    # 10 decodes against 2 at 1 s of prefill: 31.25 ms spared of 500
    ("spread-of-a-short-prefill", [ep("a", running=10), ep("b", running=2)],
     {}, {0: 1000.0}, {"spread_ms": 500.0}, {"a": 0.9375, "b": 1.0}),
    # 24 decodes against 8 at 8 s: 500 ms spared, the whole spread (and more: floored at 0)
    ("spread-saturates", [ep("a", running=24), ep("b", running=8), ep("c", running=40)],
     {}, {0: 8000.0}, {"spread_ms": 500.0}, {"a": 0.0, "b": 1.0, "c": 0.0}),
    ("spread-keeps-the-gate", [ep("a", running=10), ep("b", running=2)],
     {"a": 9000}, {9000: 100.0, 0: 1000.0}, {"min_prefill_ms": 500.0, "spread_ms": 500.0},
     {"a": 1.0, "b": 1.0}),
    # a P/D fleet's decode engines: the decider, after the pick, says who prefills
    ("decode-role-endpoints-score-equal",
     [ep("a", running=10, role="decode"), ep("b", running=2, role="decode")],
     {}, {0: 1000.0}, {}, {"a": 1.0, "b": 1.0}),
]  # fmt: skip


@pytest.mark.parametrize(
    ("endpoints", "cached", "prefill", "params", "expected"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_decode_tpot_scores(
    endpoints: list[EndpointView],
    cached: dict[str, int],
    prefill: dict[int, float],
    params: dict[str, Any],
    expected: dict[str, float],
) -> None:
    scorer = make("decode-tpot", **params)
    c = ctx()
    c.cached_tokens.update(cached)
    c.prefill_ms_by_cached.update(prefill)
    out = scorer.score(c, req(prompt_tokens=10_000), endpoints)
    assert out == pytest.approx(expected, abs=2e-3)


@pytest.mark.parametrize(
    ("endpoint", "own_ms", "expected"),
    [
        (ep("a"), 1000.0, (0, 0.0)),
        (ep("a", running=3), 0.0, (3, 0.0)),
        (ep("a", running=3), 512.0, (3, 2.0)),
        (ep("a", running=2, tokens_in_flight=200), 1000.0, (2, 10.0)),
        (ep("a", running=2, tokens_in_flight=2), 160.0, (2, 10.0)),
    ],
    ids=["no-decodes", "no-prefill", "default-remaining", "reported-remaining", "floored"],
)
def test_stall_ms_per_token(
    endpoint: EndpointView, own_ms: float, expected: tuple[int, float]
) -> None:
    p = DecodeTPOTParams.model_validate({"decode_tokens": 256, "min_remaining_tokens": 16})
    assert stall_ms_per_token(endpoint, own_ms, p) == pytest.approx(expected)


def test_empty_candidates_score_nothing() -> None:
    assert make("decode-tpot").score(ctx(), req(), []) == {}


@pytest.mark.parametrize(
    ("params", "message"),
    [({"epsilon_ms": 0}, "greater than 0"), ({"typo": 1}, "typo"),
     ({"min_prefill_ms": -1}, "greater than or equal to 0"),
     ({"spread_ms": -1}, "greater than or equal to 0")],
    ids=["zero-epsilon", "unknown-param", "negative-gate", "negative-spread"],
)  # fmt: skip
def test_bad_params_are_refused(params: dict[str, Any], message: str) -> None:
    raw = {
        "plugins": [{"name": "d", "type": "decode-tpot", "params": params}],
        "profiles": {"default": {"plugins": [{"ref": "d", "weight": 1}]}},
    }
    with pytest.raises(ConfigError, match=message):
        load_config(raw, env=ENV)
