"""ttft-cost's interference and recompute terms (ranking cost beyond the request's own TTFT)
and its count of picks still waiting for their first byte; the P/D decider's load rule."""

from __future__ import annotations

from typing import Any

import pytest

from services.common.routing.types import Choice, EndpointView, Pick
from tests.unit._routing_helpers import ctx, ep, make, req

# LinearModel: 0.1 ms per uncached token → model throughput 10,000 tokens/s.


def pick(target: str, prefill: str | None = None, cached: int = 0) -> Pick:
    return Pick(
        decode=Choice(ep(target), 1.0),
        prefill=Choice(ep(prefill), 1.0) if prefill else None,
        profile="p",
        predicted_cached_tokens=cached,
    )


def scores(cost: Any, eps: list[EndpointView], cached: dict[str, int], prompt: int) -> dict:
    c = ctx()
    c.cached_tokens.update(cached)
    r = req(prompt_tokens=prompt)
    cost.prepare(c, r, eps)
    return {"scores": cost.score(c, r, eps), "predicted": dict(c.predicted_ttft_ms)}


def best(s: dict[str, float]) -> str:
    return max(sorted(s), key=lambda k: s[k])


@pytest.mark.parametrize(
    ("params", "awaiting", "cached", "winner"),
    [
        # a: 2 unanswered picks, prompt 1000 tokens uncached (100 ms); b: idle, same.
        ({}, {"a": 2}, {}, "a"),  # off: equal TTFT, tie → lowest id
        ({"interference": 1.0}, {"a": 2}, {}, "b"),  # a costs 100 + 2*100
        # a holds 900 cached tokens: own 10 ms + 2*10 = 30 < b's 100 → stays.
        ({"interference": 1.0}, {"a": 2}, {"a": 900}, "a"),
        # a holds 500: 50 + k*50; with k=2 and interference 1 → 150 > 100 → b.
        ({"interference": 1.0}, {"a": 2}, {"a": 500}, "b"),
        ({"interference": 0.5}, {"a": 2}, {"a": 500}, "a"),  # 50 + 50 = 100, tie → a
    ],
    ids=["off", "spread-uncached", "keep-cached", "escape-when-costly", "weaker-weight"],
)
def test_interference_ranking(
    params: dict[str, float], awaiting: dict[str, int], cached: dict[str, int], winner: str
) -> None:
    cost = make("ttft-cost", epsilon_ms=0.0001, **params)
    for iid, n in awaiting.items():
        for i in range(n):
            cost.on_pick(0.0, req(f"{iid}{i}"), pick(iid))
    out = scores(cost, [ep("a"), ep("b")], cached, 1000)
    assert best(out["scores"]) == winner
    # The prediction for the SLO filter / response is the request's own TTFT only.
    own = {i: 0.1 * (1000 - cached.get(i, 0)) for i in ("a", "b")}
    assert out["predicted"] == pytest.approx(own)


@pytest.mark.parametrize(
    ("recompute", "pending_a", "winner"),
    [
        # a: 800 cached of 1000 (own 20 ms) behind 1500 pending tokens (150 ms) = 170 ms;
        # b: idle, own 100 ms. Own TTFT alone prefers b; counting b's 80 ms of extra
        # prefill work once (recompute 1) makes it 180 ms, so a keeps its cache.
        (0.0, 1500, "b"),
        (1.0, 1500, "a"),
        (1.0, 3000, "b"),  # a's queue (300 ms) outweighs even the doubled work
    ],
    ids=["off", "keeps-cache", "queue-wins"],
)
def test_recompute_ranking(recompute: float, pending_a: int, winner: str) -> None:
    cost = make("ttft-cost", epsilon_ms=0.0001, recompute=recompute)
    eps = [ep("a", pending_prefill_tokens=pending_a), ep("b")]
    out = scores(cost, eps, {"a": 800}, 1000)
    assert best(out["scores"]) == winner


@pytest.mark.parametrize(
    ("events", "expected"),
    [
        ([("pick", "r1", "a", None, 0.0)], {"a": 1}),
        ([("pick", "r1", "a", None, 0.0), ("pick", "r2", "a", None, 1.0)], {"a": 2}),
        ([("pick", "r1", "a", None, 0.0), ("settle", "r1", "a", None, 0.0)], {}),
        ([("pick", "r1", "a", None, 0.0), ("fail", "r1", "a", None, 0.0)], {}),
        # Settling twice or an unknown request changes nothing.
        (
            [
                ("pick", "r1", "a", None, 0.0),
                ("settle", "r1", "a", None, 0.0),
                ("settle", "r1", "a", None, 0.0),
                ("settle", "zz", "a", None, 0.0),
            ],
            {},
        ),
        # Disaggregated: the prefill instance computes the prompt, it is the one counted.
        ([("pick", "r1", "d", "p", 0.0)], {"p": 1}),
        # Re-picking the same request id moves it.
        ([("pick", "r1", "a", None, 0.0), ("pick", "r1", "b", None, 1.0)], {"b": 1}),
        # Picks never settled stop counting after awaiting_ttl_s (10 s here).
        ([("pick", "r1", "a", None, 0.0), ("pick", "r2", "b", None, 11.0)], {"b": 1}),
    ],
    ids=["one", "two", "settled", "failed", "idempotent", "prefill-target", "re-pick", "ttl"],
)
def test_awaiting_count(
    events: list[tuple[str, str, str, str | None, float]], expected: dict[str, int]
) -> None:
    cost = make("ttft-cost", interference=1.0, awaiting_ttl_s=10.0)
    for kind, rid, target, prefill, now in events:
        p = pick(target, prefill)
        if kind == "pick":
            cost.on_pick(now, req(rid), p)
        else:
            cost.on_settle(req(rid), p, kind == "settle")
    assert {i: cost.awaiting(i) for i in "abdp" if cost.awaiting(i)} == expected


def test_awaiting_not_tracked_when_off() -> None:
    cost = make("ttft-cost")
    cost.on_pick(0.0, req("r1"), pick("a"))
    assert cost.awaiting("a") == 0


def disagg_pick(rid: str, prefill: str, prompt: int, cached: int = 0) -> tuple[Any, Pick]:
    return req(rid, prompt_tokens=prompt), pick("d", prefill, cached)


@pytest.mark.parametrize(
    ("backlog", "predicted", "margin", "expected"),
    [
        # LinearModel: 10,000 tokens/s; the request: 4000 uncached tokens (400 ms).
        ({}, 400.0, 0.0, True),  # no prefill instance seen: idle pool, disaggregate
        ({"p0": 0}, 400.0, 0.0, True),  # idle prefill instance: the paths tie → split
        ({"p0": 5000, "p1": 20_000}, 400.0, 0.0, False),  # p0 waits 500 ms: local is faster
        ({"p0": 5000}, 900.0, 0.0, True),  # the decode instance is as slow (900 = 500 + 400)
        ({"p0": 5000}, 400.0, 600.0, True),  # faster by 500 ms, not by the 600 ms margin
        ({"p0": 5000}, None, 0.0, True),  # no prediction for the decode instance
    ],
    ids=["no-prefill-seen", "idle-pool", "busy-pool", "tie", "margin", "no-prediction"],
)
def test_pd_decider_load_rule(
    backlog: dict[str, int], predicted: float | None, margin: float, expected: bool
) -> None:
    d = make("pd-decider", threshold_tokens=512, load_rule=True, local_margin_ms=margin)
    for pid, tokens in backlog.items():
        d.on_pick(0.0, *disagg_pick(f"bg-{pid}", pid, tokens))
        if tokens == 0:
            d.on_settle(*disagg_pick(f"bg-{pid}", pid, tokens), True)
    c = ctx()
    if predicted is not None:
        c.predicted_ttft_ms["d"] = predicted
    choice = Choice(ep("d", role="decode"), 0.0)
    assert d.disaggregate(c, req(prompt_tokens=4000), choice) is expected


@pytest.mark.parametrize(
    ("events", "wait_ms"),
    [
        ([("pick", "r1", "p0", 3000, 0, 0.0)], 300.0),
        ([("pick", "r1", "p0", 3000, 1000, 0.0)], 200.0),  # minus the predicted cached
        ([("pick", "r1", "p0", 3000, 0, 0.0), ("settle", "r1", "p0", 3000, 0, 0.0)], 0.0),
        ([("pick", "r1", "p0", 3000, 0, 0.0), ("pick", "r2", "p1", 1000, 0, 0.0)], 100.0),
        ([("pick", "r1", None, 3000, 0, 0.0)], 0.0),  # decode-only picks are no backlog
        # Unsettled for longer than backlog_ttl_s (10 s): forgotten.
        ([("pick", "r1", "p0", 3000, 0, 0.0), ("pick", "r2", "p0", 1000, 0, 11.0)], 100.0),
    ],
    ids=["one", "cached-part", "settled", "least-backlogged", "decode-only", "ttl"],
)
def test_pd_decider_backlog(
    events: list[tuple[str, str, str | None, int, int, float]], wait_ms: float
) -> None:
    d = make("pd-decider", load_rule=True, backlog_ttl_s=10.0)
    for kind, rid, prefill, prompt, cached, now in events:
        r = req(rid, prompt_tokens=prompt)
        p = pick("d", prefill, cached)
        if kind == "pick":
            d.on_pick(now, r, p)
        else:
            d.on_settle(r, p, True)
    assert d.prefill_wait_ms() == pytest.approx(wait_ms)


def test_pd_decider_without_load_rule_keeps_no_state() -> None:
    d = make("pd-decider", threshold_tokens=512)
    d.on_pick(0.0, *disagg_pick("r1", "p0", 5000))
    assert d.prefill_wait_ms() == 0.0


@pytest.mark.parametrize(
    ("decode", "a", "b", "cached", "winner"),
    [
        # prompt 1000 tokens (100 ms uncached); a runs 4 decodes, b runs 1; queues empty.
        (0.0, {"running": 4}, {"running": 1}, {}, "a"),  # off: equal TTFT, tie → lowest id
        # a: 100 + 0.5 * 4 * 100 = 300; b: 100 + 0.5 * 1 * 100 = 150 → b.
        (0.5, {"running": 4}, {"running": 1}, {}, "b"),
        # this gateway's unreported picks count as running there too: b 1 + 3 reserved = 4.
        (0.5, {"running": 2}, {"running": 1, "reserved_requests": 3}, {}, "a"),
        # a holds 900 cached tokens: own 10 ms, 10 + 0.5 * 4 * 10 = 30 < b's 150 → stays.
        (0.5, {"running": 4}, {"running": 1}, {"a": 900}, "a"),
        # the stall outweighs b's queue: a 100 + 0.5 * 8 * 100 = 500;
        # b 200 (2000 tokens queued) + 100 + 0 = 300 → b.
        (0.5, {"running": 8}, {"pending_prefill_tokens": 2000}, {}, "b"),
        # ... but not a longer one: b 500 (5000 queued) + 100 = 600 > a's 500 → a.
        (0.5, {"running": 8}, {"pending_prefill_tokens": 5000}, {}, "a"),
    ],
    ids=[
        "off",
        "fewer-decodes",
        "reserved-count",
        "keep-cached",
        "stall-beats-queue",
        "queue-beats-stall",
    ],
)
def test_decode_stall_ranking(
    decode: float,
    a: dict[str, int],
    b: dict[str, int],
    cached: dict[str, int],
    winner: str,
) -> None:
    cost = make("ttft-cost", epsilon_ms=0.0001, decode=decode)
    out = scores(cost, [ep("a", **a), ep("b", **b)], cached, 1000)
    assert best(out["scores"]) == winner
    # The stall only ranks: the prediction stays the request's own TTFT.
    own = {i: 0.1 * (1000 - cached.get(i, 0)) for i in ("a", "b")}
    queued = {"a": a.get("pending_prefill_tokens", 0), "b": b.get("pending_prefill_tokens", 0)}
    assert out["predicted"] == pytest.approx({i: own[i] + 0.1 * queued[i] for i in own})
