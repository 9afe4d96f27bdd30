"""The slo-goodput scorer: P(meet TTFT) x P(decodes meet TPOT), and its fallbacks."""

from __future__ import annotations

from typing import Any

import pytest

from services.common.routing.config import load_config
from services.common.routing.plugins.goodput import SLOGoodputParams, meet_probability
from services.common.routing.registry import REGISTRY, PluginEnv
from services.common.routing.types import EndpointSnapshot, EndpointView, Pick
from tests.unit._routing_helpers import LinearModel, ctx, ep, req


class DecodeModel(LinearModel):
    """0.1 ms per prefilled token; a decode step is 10 ms + 1 ms per sequence; KV of
    100,000 tokens (context is free, so tests read the batch term alone)."""

    kv_capacity_tokens = 100_000

    def decode_step_ms(self, batch: int, context_tokens: int) -> float:
        return 10.0 + 1.0 * batch if batch > 0 else 0.0


def _make(model: object | None = None, **params: Any) -> Any:
    m = model if model is not None else DecodeModel()
    env = PluginEnv(perf_profile=lambda name: m, block_size=4)  # type: ignore[arg-type,return-value]
    return REGISTRY["slo-goodput"].factory("gp", SLOGoodputParams.model_validate(params), env)


@pytest.mark.parametrize(
    ("predicted", "target", "sigma", "expected"),
    [
        (1000.0, 1000.0, 0.3, 0.5),
        (0.0, 1000.0, 0.3, 1.0),
        (1000.0, 0.0, 0.3, 0.0),
        (500.0, 1000.0, 0.3, 0.9895),  # ln 2 / 0.3 = 2.31 sigma
        (2000.0, 1000.0, 0.3, 0.0105),
    ],
    ids=["at-target", "nothing-to-wait", "no-room", "half-the-budget", "twice-the-budget"],
)
def test_meet_probability(predicted: float, target: float, sigma: float, expected: float) -> None:
    assert meet_probability(predicted, target, sigma) == pytest.approx(expected, abs=1e-3)


# Each case: endpoints, their predicted TTFT (ms; None = no prediction), the request's
# TTFT / TPOT targets and prompt, the scorer's params, and the expected scores.
CASES: list[tuple[str, list[EndpointView], dict[str, float | None], dict[str, Any],
                  dict[str, Any], dict[str, float]]] = [
    ("no-ttft-budget-scores-nothing", [ep("a"), ep("b")], {"a": 100.0, "b": 5000.0},
     {"ttft_slo_ms": 0.0}, {}, {"a": 0.0, "b": 0.0}),
    ("feasible-beats-infeasible", [ep("a"), ep("b")], {"a": 500.0, "b": 4000.0},
     {"ttft_slo_ms": 2000.0}, {"tpot": False}, {"a": 1.0, "b": 0.024}),
    ("at-budget-is-a-coin-flip", [ep("a")], {"a": 2000.0},
     {"ttft_slo_ms": 2000.0}, {"tpot": False}, {"a": 0.5}),
    ("no-prediction-scores-zero", [ep("a"), ep("b")], {"a": 500.0, "b": None},
     {"ttft_slo_ms": 2000.0}, {"tpot": False}, {"a": 1.0, "b": 0.0}),
    ("hopeless-everywhere-is-left-to-the-others", [ep("a"), ep("b")],
     {"a": 20_000.0, "b": 40_000.0}, {"ttft_slo_ms": 2000.0}, {"tpot": False},
     {"a": 0.0, "b": 0.0}),
    ("hopeless-everywhere-by-predicted-ttft", [ep("a"), ep("b")],
     {"a": 20_000.0, "b": 40_000.0}, {"ttft_slo_ms": 2000.0}, {"tpot": False, "hopeless": "ttft"},
     {"a": 1.0, "b": 0.5}),
    ("no-tpot-target-is-ttft-only", [ep("a", running=200)], {"a": 500.0},
     {"ttft_slo_ms": 2000.0, "tpot_slo_ms": 0.0}, {}, {"a": 1.0}),
    # step at 10 running + this one: 21 ms, far within 100 ms
    ("light-decode-batch-meets-tpot", [ep("a", running=10)], {"a": 500.0},
     {"ttft_slo_ms": 2000.0, "tpot_slo_ms": 100.0}, {}, {"a": 1.0}),
    # 99 running + this one: a 110 ms step against 100 ms
    ("heavy-decode-batch-misses-tpot", [ep("a", running=99), ep("b", running=10)],
     {"a": 500.0, "b": 500.0}, {"ttft_slo_ms": 2000.0, "tpot_slo_ms": 100.0}, {},
     {"a": 0.352, "b": 1.0}),
    # 4 running with 64 tokens each still to emit: this prompt's 10,000-token prefill
    # (1 s) adds 1000 / 64 = 15.6 ms per token on a 15 ms step, ~31 ms against 30 ms;
    # with 10,000 tokens each still to come it adds 0.1 ms (both times P(TTFT 1 s of 2 s))
    ("own-prefill-spread-over-running-decodes",
     [ep("a", running=4, tokens_in_flight=256), ep("b", running=4, tokens_in_flight=40_000)],
     {"a": 1000.0, "b": 1000.0},
     {"ttft_slo_ms": 2000.0, "tpot_slo_ms": 30.0, "prompt_tokens": 10_000},
     {}, {"a": 0.456, "b": 0.973}),  # x P(TTFT) = 0.976
    # queued prefill (engine + reservations) stalls the decodes like the prompt's own
    ("queued-prefill-counts-for-tpot",
     [ep("a", running=4, tokens_in_flight=10_256, pending_prefill_tokens=10_000),
      ep("b", running=4, tokens_in_flight=256)],
     {"a": 1000.0, "b": 1000.0}, {"ttft_slo_ms": 4000.0, "tpot_slo_ms": 40.0},
     {}, {"a": 0.857, "b": 1.0}),
    # first_chunk_steps: 100 steps of (10 + 1) ms = 1.1 s on top of 1 s against 2 s
    ("first-chunk-steps-add-decode-time", [ep("a")], {"a": 1000.0},
     {"ttft_slo_ms": 2000.0}, {"tpot": False, "first_chunk_steps": 100}, {"a": 0.445}),
]  # fmt: skip


@pytest.mark.parametrize(
    ("endpoints", "preds", "request_kw", "params", "expected"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_slo_goodput_rules(
    endpoints: list[EndpointView],
    preds: dict[str, float | None],
    request_kw: dict[str, Any],
    params: dict[str, Any],
    expected: dict[str, float],
) -> None:
    gp = _make(**params)
    c = ctx()
    for iid, p in preds.items():
        if p is not None:
            c.predicted_ttft_ms[iid] = p
    kw = {"prompt_tokens": 1000, **request_kw}
    if kw["prompt_tokens"] == 10_000:
        c.prefill_ms_by_cached[0] = 1000.0  # own prefill of the uncached prompt
    out = gp.score(c, req(**kw), endpoints)
    assert out == pytest.approx(expected, abs=2e-3)


# ``hopeless: late``: the request's own prefill is 4.5 s everywhere (``own``; None: not
# predicted), so with a 2 s budget it is hopeless on every endpoint; an endpoint whose
# queue alone (predicted TTFT - own prefill) is past the budget is "late".
LATE_CASES: list[tuple[str, dict[str, float], float | None, dict[str, Any], dict[str, float]]] = [
    ("goes-where-the-queue-is-already-lost", {"a": 20_000.0, "b": 5000.0}, 4500.0,
     {"hopeless": "late"}, {"a": 1.0, "b": 0.0}),
    ("no-lost-queue-scores-nothing", {"a": 6000.0, "b": 5000.0}, 4500.0,
     {"hopeless": "late"}, {"a": 0.0, "b": 0.0}),
    ("queue-exactly-at-the-budget-is-lost", {"a": 6500.0, "b": 5000.0}, 4500.0,
     {"hopeless": "late"}, {"a": 1.0, "b": 0.0}),
    ("own-prefill-unknown-scores-nothing", {"a": 20_000.0, "b": 5000.0}, None,
     {"hopeless": "late"}, {"a": 0.0, "b": 0.0}),
    ("only-hopeless-keeps-the-rule", {"a": 20_000.0, "b": 5000.0}, 4500.0,
     {"hopeless": "late", "only_hopeless": True}, {"a": 1.0, "b": 0.0}),
    ("only-hopeless-leaves-a-feasible-request-alone", {"a": 20_000.0, "b": 500.0}, 400.0,
     {"hopeless": "late", "only_hopeless": True}, {"a": 0.0, "b": 0.0}),
    ("feasible-request-scored-as-before", {"a": 20_000.0, "b": 500.0}, 400.0,
     {"hopeless": "late"}, {"a": 0.0, "b": 1.0}),
]  # fmt: skip


@pytest.mark.parametrize(
    ("preds", "own", "params", "expected"), [c[1:] for c in LATE_CASES],
    ids=[c[0] for c in LATE_CASES],
)  # fmt: skip
def test_hopeless_requests_go_where_the_queue_is_already_late(
    preds: dict[str, float], own: float | None, params: dict[str, Any], expected: dict[str, float]
) -> None:
    gp = _make(tpot=False, **params)
    c = ctx()
    c.predicted_ttft_ms.update(preds)
    if own is not None:
        c.prefill_ms_by_cached[0] = own  # nothing cached anywhere
    out = gp.score(c, req(prompt_tokens=1000, ttft_slo_ms=2000.0), [ep("a"), ep("b")])
    assert out == pytest.approx(expected, abs=2e-3)


def test_without_a_decode_model_tpot_is_not_judged() -> None:
    gp = _make(model=LinearModel())
    c = ctx()
    c.predicted_ttft_ms["a"] = 500.0
    out = gp.score(c, req(ttft_slo_ms=2000.0, tpot_slo_ms=1.0), [ep("a", running=500)])
    assert out == pytest.approx({"a": 1.0}, abs=1e-3)


PROFILES = {
    "plugins": [
        {"name": "prefix", "type": "approx-prefix"},
        {"name": "ttft", "type": "ttft-cost"},
        {"name": "gp", "type": "slo-goodput", "params": {"tpot": False}},
        {"name": "gp-ttft", "type": "slo-goodput", "params": {"tpot": False, "hopeless": "ttft"}},
    ],
    "profiles": {
        "prefix-first": {"plugins": [{"ref": "prefix", "weight": 6}, {"ref": "ttft", "weight": 1}]},
        "goodput": {"plugins": [{"ref": "prefix", "weight": 6}, {"ref": "ttft", "weight": 1},
                                {"ref": "gp", "weight": 8}]},
        "goodput-ttft": {"plugins": [{"ref": "prefix", "weight": 6}, {"ref": "ttft", "weight": 1},
                                     {"ref": "gp-ttft", "weight": 8}]},
    },
    "default_profile": "prefix-first",
}  # fmt: skip


@pytest.mark.parametrize(
    ("profile", "budget", "winner"),
    [
        ("prefix-first", 2000.0, "hit"),
        ("goodput", 2000.0, "idle"),
        ("goodput", 0.0, "hit"),
        ("goodput", 100.0, "hit"),
        ("goodput-ttft", 100.0, "idle"),
    ],
    ids=["prefix-wins-without-goodput", "goodput-moves-to-the-feasible-instance",
         "no-budget-leaves-the-others-to-decide", "hopeless-left-to-the-others",
         "hopeless-by-ttft-goes-to-the-fastest"],
)  # fmt: skip
def test_goodput_in_a_profile(profile: str, budget: float, winner: str) -> None:
    # "hit" holds the prompt's prefix but has 25,000 prefill tokens queued (2.5 s at 0.1 ms
    # a token, over a 2 s budget); "idle" computes the 8,000-token prompt in 0.8 s.
    env = PluginEnv(perf_profile=lambda name: DecodeModel(), block_size=4)  # type: ignore[arg-type,return-value]
    sched = load_config(PROFILES, env=env)
    hashes = tuple(range(1, 2001))
    warm = req("warm", prompt_tokens=8000, block_hashes=hashes)
    first = sched.schedule(warm, EndpointSnapshot([ep("hit")]), 0.0, profile)
    assert isinstance(first, Pick)
    snap = EndpointSnapshot([ep("hit", pending_prefill_tokens=25_000), ep("idle")])
    r = req("r", prompt_tokens=8000, block_hashes=hashes, ttft_slo_ms=budget)
    d = sched.schedule(r, snap, 1.0, profile)
    assert isinstance(d, Pick) and d.decode.endpoint.instance_id == winner
