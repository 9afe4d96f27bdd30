"""Predicted-TTFT cost, SLO filter, session affinity, length buckets, P/D decider."""

from __future__ import annotations

import pytest

from services.common.routing.types import Choice, EndpointView, Pick, Shed
from tests.unit._routing_helpers import ctx, ep, make, req

# LinearModel: 0.1 ms per uncached token → model throughput 10,000 tokens/s.


@pytest.mark.parametrize(
    ("endpoint", "cached", "prompt", "expected_ms"),
    [
        (ep("a"), 0, 1000, 100.0),
        (ep("a"), 600, 1000, 40.0),
        (ep("a"), 5000, 1000, 0.0),  # cached capped at the prompt
        (ep("a", pending_prefill_tokens=10_000), 0, 1000, 1100.0),
        (ep("a", pending_prefill_tokens=5_000, reserved_tokens=5_000), 0, 1000, 1100.0),
        (ep("a", pending_prefill_tokens=10_000, prefill_tokens_per_s=20_000), 0, 1000, 600.0),
        (ep("a", pending_prefill_tokens=10_000, prefill_tokens_per_s=1_000), 0, 1000, 1100.0),
    ],
    ids=[
        "idle",
        "cached-suffix",
        "cap",
        "queue-wait",
        "reserved-wait",
        "engine-faster-than-model",
        "engine-rate-below-model-is-not-capacity",
    ],
)
def test_ttft_prediction(
    endpoint: EndpointView, cached: int, prompt: int, expected_ms: float
) -> None:
    cost = make("ttft-cost")
    c = ctx()
    c.cached_tokens[endpoint.instance_id] = cached
    cost.prepare(c, req(prompt_tokens=prompt), [endpoint])
    assert c.predicted_ttft_ms[endpoint.instance_id] == pytest.approx(expected_ms)


def test_ttft_score_is_min_over_cost() -> None:
    cost = make("ttft-cost", epsilon_ms=0.0001)
    c = ctx()
    c.cached_tokens["b"] = 500
    eps = [ep("a"), ep("b"), ep("c", pending_prefill_tokens=20_000)]
    cost.prepare(c, req(prompt_tokens=1000), eps)  # a 100 ms, b 50 ms, c 2100 ms
    assert cost.score(c, req(), eps) == pytest.approx(
        {"a": 0.5, "b": 1.0, "c": 50 / 2100}, rel=1e-3
    )


def test_ttft_cost_prefers_cache_until_queue_outweighs_it() -> None:
    cost = make("ttft-cost")
    r = req(prompt_tokens=10_000)
    for pending, winner in [(0, "hit"), (5_000, "hit"), (20_000, "miss")]:
        c = ctx()
        c.cached_tokens["hit"] = 9_000
        eps = [ep("hit", pending_prefill_tokens=pending), ep("miss")]
        cost.prepare(c, r, eps)
        s = cost.score(c, r, eps)
        assert max(s, key=lambda k: s[k]) == winner, pending


@pytest.mark.parametrize(
    ("budget", "preds", "expected"),
    [
        (0.0, {"a": 900.0, "b": 1000.0}, ["a", "b"]),
        (950.0, {"a": 900.0, "b": 1000.0}, ["a"]),
        (500.0, {"a": 900.0, "b": 1000.0}, Shed("", 400)),
        (890.0, {"a": 900.0}, Shed("", 100)),  # clamped to min_retry_after_ms
        (1.0, {"a": 99_000.0}, Shed("", 30_000)),  # clamped to max
        (500.0, {}, ["a", "b"]),  # no predictions: pass
    ],
    ids=["no-budget", "keep-feasible", "shed", "retry-floor", "retry-cap", "no-cost-plugin"],
)
def test_ttft_slo_filter(budget: float, preds: dict[str, float], expected: object) -> None:
    f = make("ttft-slo")
    c = ctx()
    c.predicted_ttft_ms.update(preds)
    out = f.filter(
        c, req(ttft_slo_ms=budget), [ep("a"), ep("b")] if "b" in preds or not preds else [ep("a")]
    )
    if isinstance(expected, Shed):
        assert isinstance(out, Shed) and out.retry_after_ms == expected.retry_after_ms
        assert "infeasible" in out.reason
    else:
        assert [e.instance_id for e in out] == expected  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("mode", "idle_ms", "expected"),
    [
        ("serve", {"a": 600.0, "b": 700.0}, ["a", "b"]),
        ("shed", {"a": 600.0, "b": 700.0}, "shed"),
        ("serve", {"a": 400.0, "b": 700.0}, "shed"),  # feasible idle on a: load, so shed
    ],
    ids=["infeasible-idle-served", "infeasible-idle-shed", "load-induced-shed"],
)
def test_ttft_slo_filter_infeasible_even_idle(
    mode: str, idle_ms: dict[str, float], expected: object
) -> None:
    """Budget 500 ms, both endpoints predicted 900+ ms; whether the request's own prefill
    alone (no wait) already misses the budget everywhere decides serve vs shed."""
    f = make("ttft-slo", infeasible_idle=mode)
    c = ctx()
    c.predicted_ttft_ms.update({"a": 900.0, "b": 1000.0})
    c.cached_tokens.update({"a": 100, "b": 200})
    c.prefill_ms_by_cached.update({100: idle_ms["a"], 200: idle_ms["b"]})
    out = f.filter(c, req(ttft_slo_ms=500.0, prompt_tokens=1000), [ep("a"), ep("b")])
    if expected == "shed":
        assert isinstance(out, Shed) and "infeasible" in out.reason
    else:
        assert [e.instance_id for e in out] == expected  # type: ignore[union-attr]


def test_ttft_cost_records_own_prefill() -> None:
    cost = make("ttft-cost")
    c = ctx()
    c.cached_tokens["b"] = 500
    cost.prepare(c, req(prompt_tokens=1000), [ep("a", pending_prefill_tokens=10_000), ep("b")])
    own = {e: c.own_prefill_ms(e, 1000) for e in ("a", "b", "unknown")}
    assert own == pytest.approx({"a": 100.0, "b": 50.0, "unknown": 100.0})
    assert c.predicted_ttft_ms == pytest.approx({"a": 1100.0, "b": 50.0})


def _served(decode: str) -> Pick:
    return Pick(decode=Choice(ep(decode), 0.0), prefill=None, profile="p")


@pytest.mark.parametrize(
    ("session", "history", "now", "endpoints", "expected"),
    [
        ("", [("s1", "a", 0.0)], 1.0, [ep("a"), ep("b")], {}),
        ("s1", [], 1.0, [ep("a"), ep("b")], {}),
        ("s1", [("s1", "a", 0.0)], 1.0, [ep("a"), ep("b")], {"a": 1.0}),
        ("s1", [("s1", "a", 0.0), ("s1", "b", 0.5)], 1.0, [ep("a"), ep("b")], {"b": 1.0}),
        ("s1", [("s1", "a", 0.0)], 100.0, [ep("a"), ep("b")], {}),  # ttl 60
        ("s1", [("s1", "a", 0.0)], 1.0, [ep("b")], {}),  # sticky not a candidate
        ("s1", [("s1", "a", 0.0)], 1.0, [ep("a", waiting=10), ep("b")], {}),  # queue escape
        ("s1", [("s1", "a", 0.0)], 1.0, [ep("a", waiting=4), ep("b")], {"a": 1.0}),  # within delta
        ("s1", [("s1", "a", 0.0)], 1.0, [ep("a", kv_usage=0.97), ep("b")], {}),  # kv escape
        (
            "s1",
            [("s1", "a", 0.0), ("s2", "b", 0.1), ("s3", "b", 0.2)],
            1.0,
            [ep("a"), ep("b")],
            {},
        ),  # LRU
    ],
    ids=[
        "no-session",
        "unknown",
        "sticky",
        "latest-wins",
        "expired",
        "not-candidate",
        "queue-escape",
        "within-delta",
        "kv-escape",
        "lru-evicted",
    ],
)
def test_session_affinity(
    session: str,
    history: list[tuple[str, str, float]],
    now: float,
    endpoints: list[EndpointView],
    expected: dict[str, float],
) -> None:
    sa = make(
        "session-affinity", ttl_s=60, max_sessions=2, escape_queue_delta=5, escape_kv_usage=0.95
    )
    for sid, iid, t in history:
        sa.on_pick(t, req(session_id=sid), _served(iid))
    assert sa.score(ctx(now=now), req(session_id=session), endpoints) == expected


@pytest.mark.parametrize(
    ("history", "now", "expected"),
    [
        pytest.param([("root", "b", 0.0)], 2.0, {"b": 1.0}, id="unseen-sub-agent-follows-parent"),
        pytest.param(
            [("root", "b", 0.0), ("sub", "c", 1.0)], 2.0, {"c": 1.0}, id="seen-sub-agent-its-own"
        ),
        pytest.param([("root", "b", 0.0)], 100.0, {}, id="parent-expired"),
    ],
)
def test_session_affinity_of_a_sub_agent(
    history: list[tuple[str, str, float]], now: float, expected: dict[str, float]
) -> None:
    sa = make("session-affinity", ttl_s=60)
    for sid, iid, t in history:
        sa.on_pick(t, req(session_id=sid), _served(iid))
    sub = req(session_id="sub", parent_session_id="root")
    assert sa.score(ctx(now=now), sub, [ep("a"), ep("b"), ep("c")]) == expected


@pytest.mark.parametrize(
    ("prompt", "endpoints", "kept"),
    [
        (100, [ep("a"), ep("b"), ep("c"), ep("d")], ["a", "b"]),  # bucket 0 of 2
        (5000, [ep("a"), ep("b"), ep("c"), ep("d")], ["c", "d"]),
        (1024, [ep("a"), ep("b")], ["b"]),  # boundary belongs to the upper bucket
        (
            100,
            [
                ep("a", labels={"tideserve.io/length-bucket": "1"}),
                ep("b", labels={"tideserve.io/length-bucket": "0"}),
            ],
            ["b"],
        ),
        (100, [ep("a", labels={"tideserve.io/length-bucket": "1"})], ["a"]),  # empty bucket → all
        (
            100,
            [ep("a", labels={"tideserve.io/length-bucket": "junk"}), ep("b")],
            ["a"],
        ),  # bad label → position
    ],
    ids=["short", "long", "boundary", "labels", "fallback", "bad-label"],
)
def test_length_bucket(prompt: int, endpoints: list[EndpointView], kept: list[str]) -> None:
    f = make("length-bucket", boundaries=[1024])
    assert [e.instance_id for e in f.filter(ctx(), req(prompt_tokens=prompt), endpoints)] == kept


@pytest.mark.parametrize(
    ("role", "prompt", "cached", "expected"),
    [
        ("decode", 1000, 0, True),
        ("decode", 1000, 600, False),  # uncached 400 < 512
        ("decode", 1000, 488, True),  # exactly 512
        ("decode", 100, 0, False),
        ("worker", 5000, 0, False),  # aggregated never splits
    ],
    ids=["long", "mostly-cached", "threshold-inclusive", "short", "worker"],
)
def test_pd_decider(role: str, prompt: int, cached: int, expected: bool) -> None:
    d = make("pd-decider", threshold_tokens=512)
    c = ctx()
    c.cached_tokens["d"] = cached
    assert d.disaggregate(c, req(prompt_tokens=prompt), Choice(ep("d", role=role), 0.0)) is expected
