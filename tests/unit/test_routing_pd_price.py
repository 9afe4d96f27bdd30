"""pd-price: a decode-role pick whose uncached suffix is long is disaggregated only when the
P/D path (the prefill profile's own pick: its queue and cache, then the KV transfer) is
predicted faster than the decode engine computing the prompt, unless the decode engine is
backlogged; the scheduling cycle runs the prefill profile before asking."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import pytest

from services.common.routing.config import ConfigError, load_config
from services.common.routing.framework import CycleContext, Profile, Scheduler
from services.common.routing.registry import REGISTRY, PluginEnv
from services.common.routing.types import (
    Choice,
    EndpointSnapshot,
    EndpointView,
    Pick,
    RequestView,
)
from tests.unit._routing_helpers import ENV, ctx, ep, req


class Model:
    """Fake perf model: 0.1 ms per uncached token; a transfer costs 10 ms + 0.01 ms per
    token."""

    def prefill_ms(self, uncached_tokens: int, cached_tokens: int = 0) -> float:
        return 0.1 * uncached_tokens

    def transfer_ms(self, tokens: int) -> float:
        return 10.0 + 0.01 * tokens if tokens > 0 else 0.0


PRICED_ENV = PluginEnv(perf_profile=lambda name: Model(), block_size=4)


def decider(can: bool = True, **params: Any) -> Any:
    spec = REGISTRY["pd-price"]
    env = replace(PRICED_ENV, decode_can_prefill=can)
    return spec.factory("pd", spec.params.model_validate(params), env)


# prompt 40,000 tokens. Decode engine d: holds d_cached, predicted local TTFT d_ms; prefill
# pick p: predicted TTFT p_ms (its queue and the prompt less what it holds). The P/D path
# adds the transfer of the prompt less d_cached (10 ms + 0.01 ms per token).
# (params, d_cached, d_ms, p_ms, running, waiting on d) -> disaggregate?
CASES: list[tuple[dict[str, Any], int, float, float, int, int, bool]] = [
    ({}, 38_000, 200.0, 300.0, 0, 0, False),  # local faster
    ({}, 38_000, 200.0, 150.0, 0, 0, True),  # the prefill pick is faster, transfer included
    ({}, 38_000, 200.0, 185.0, 0, 0, False),  # faster before the transfer (30 ms), not after
    ({}, 38_000, 200.0, 170.0, 0, 0, False),  # equal with the transfer: local
    ({}, 0, 4000.0, 3500.0, 0, 0, True),  # cold everywhere: 410 ms of transfer, still faster
    ({}, 0, 4000.0, 3700.0, 0, 0, False),  # not with 410 ms more
    ({"margin_ms": -100.0}, 38_000, 200.0, 150.0, 0, 0, True),
    ({"margin_ms": 100.0}, 38_000, 200.0, 150.0, 0, 0, False),
    ({"busy_waiting": 1}, 38_000, 200.0, 300.0, 0, 1, True),  # backlogged decode engine
    ({"busy_waiting": 2}, 38_000, 200.0, 300.0, 0, 1, False),
    ({"stall": 0.1}, 38_000, 200.0, 300.0, 8, 0, True),  # + 0.1 * 8 * 200 ms own prefill
    ({"stall": 0.1}, 38_000, 200.0, 300.0, 2, 0, False),  # + 40 ms
]
IDS = [
    "local-faster",
    "prefill-faster",
    "transfer-tips-it",
    "tie-stays-local",
    "cold-prompt",
    "cold-prompt-transfer-tips-it",
    "negative-margin",
    "positive-margin",
    "backlog-gate",
    "backlog-under-gate",
    "stall-many-decodes",
    "stall-few-decodes",
]


@pytest.mark.parametrize(
    ("params", "d_cached", "d_ms", "p_ms", "running", "waiting", "expected"), CASES, ids=IDS
)
def test_pd_price_confirm(
    params: dict[str, Any],
    d_cached: int,
    d_ms: float,
    p_ms: float,
    running: int,
    waiting: int,
    expected: bool,
) -> None:
    d = decider(**params)
    c = ctx()
    c.cached_tokens["d"] = d_cached
    c.predicted_ttft_ms["d"] = d_ms
    c.predicted_ttft_ms["p"] = p_ms
    dec = Choice(ep("d", role="decode", running=running, waiting=waiting), 0.0)
    pre = Choice(ep("p", role="prefill"), 0.0)
    r = req(prompt_tokens=40_000)
    assert d.disaggregate(c, r, dec) is True
    assert d.confirm(c, r, dec, pre) is expected


# Cold contexts, prompt 40,000 tokens: (params, held by the decode engine d, held by the
# prefill pick p, d_ms, p_ms) -> disaggregate? The transfer is 10 ms + 0.01 ms x (40,000 -
# what d holds).
COLD = {"cold_tokens": 16_384, "cold_slack": 0.25}
COLD_CASES: list[tuple[dict[str, Any], int, int, float, float, bool]] = [
    ({}, 0, 0, 4000.0, 3700.0, False),  # off: 4,110 ms against 4,000 stays local
    (COLD, 0, 0, 4000.0, 3700.0, True),  # first prompt: within 25 % of local
    (COLD, 0, 0, 4000.0, 4700.0, False),  # 5,110 ms: more than 25 % slower
    ({**COLD, "cold_slack": 0.0}, 0, 0, 4000.0, 3700.0, False),
    (COLD, 10_000, 27_000, 3000.0, 3300.0, True),  # the pool holds more of it (3,610 ms)
    (COLD, 20_000, 0, 2000.0, 2100.0, False),  # d holds more: priced as usual (2,310 ms)
    ({**COLD, "cold_tokens": 50_000}, 0, 0, 4000.0, 3700.0, False),  # suffix under it
]
COLD_IDS = [
    "off",
    "first-prompt-within-slack",
    "first-prompt-past-slack",
    "no-slack",
    "pool-holds-more",
    "decode-holds-more",
    "suffix-under-cold-tokens",
]


@pytest.mark.parametrize(
    ("params", "d_cached", "p_cached", "d_ms", "p_ms", "expected"), COLD_CASES, ids=COLD_IDS
)
def test_pd_price_cold_contexts(
    params: dict[str, Any],
    d_cached: int,
    p_cached: int,
    d_ms: float,
    p_ms: float,
    expected: bool,
) -> None:
    d = decider(**params)
    c = ctx()
    c.cached_tokens.update({"d": d_cached, "p": p_cached})
    c.predicted_ttft_ms.update({"d": d_ms, "p": p_ms})
    dec = Choice(ep("d", role="decode"), 0.0)
    pre = Choice(ep("p", role="prefill"), 0.0)
    r = req(prompt_tokens=40_000)
    assert d.disaggregate(c, r, dec) is True
    assert d.confirm(c, r, dec, pre) is expected


def test_pd_price_cold_rule_leaves_workers_and_split_fleets_alone() -> None:
    c = ctx()
    c.predicted_ttft_ms.update({"d": 1.0, "p": 1e9})
    pre = Choice(ep("p", role="prefill"), 0.0)
    r = req(prompt_tokens=40_000)
    assert decider(**COLD).confirm(c, r, Choice(ep("w"), 0.0), pre) is True
    assert decider(**COLD).disaggregate(c, r, Choice(ep("w"), 0.0)) is False
    assert decider(False, **COLD).confirm(c, r, Choice(ep("d", role="decode"), 0.0), pre)


# (role, capability, uncached on the decode engine) -> may disaggregate (before pricing)?
SCREEN = [
    ("decode", True, 511, False),
    ("decode", True, 512, True),
    ("worker", True, 40_000, False),
    ("decode", False, 10, True),
    ("worker", False, 40_000, False),
]


@pytest.mark.parametrize(
    ("role", "can", "uncached", "expected"),
    SCREEN,
    ids=["short", "at-threshold", "worker", "cannot-prefill-short", "cannot-prefill-worker"],
)
def test_pd_price_screens_before_pricing(
    role: str, can: bool, uncached: int, expected: bool
) -> None:
    d = decider(can, threshold_tokens=512)
    c = ctx()
    c.cached_tokens["d"] = 1000
    assert (
        d.disaggregate(c, req(prompt_tokens=1000 + uncached), Choice(ep("d", role=role), 0.0))
        is expected
    )


def test_pd_price_without_predictions_disaggregates() -> None:
    d = decider()
    dec, pre = Choice(ep("d", role="decode"), 0.0), Choice(ep("p", role="prefill"), 0.0)
    assert d.confirm(ctx(), req(prompt_tokens=4000), dec, pre) is True


def test_pd_price_cannot_prefill_always_confirms() -> None:
    d = decider(False)
    c = ctx()
    c.predicted_ttft_ms.update({"d": 1.0, "p": 1e9})
    dec, pre = Choice(ep("d", role="decode"), 0.0), Choice(ep("p", role="prefill"), 0.0)
    assert d.confirm(c, req(prompt_tokens=4000), dec, pre) is True


class Predict:
    """Preparer + scorer: records a fixed predicted TTFT per instance, scores the lowest 1."""

    def __init__(self, name: str, ms: Mapping[str, float]) -> None:
        self.name = name
        self.ms = dict(ms)

    def prepare(
        self, ctx: CycleContext, request: RequestView, candidates: Sequence[EndpointView]
    ) -> None:
        for e in candidates:
            if e.instance_id in self.ms:
                ctx.predicted_ttft_ms[e.instance_id] = self.ms[e.instance_id]

    def score(
        self, ctx: CycleContext, request: RequestView, candidates: Sequence[EndpointView]
    ) -> Mapping[str, float]:
        best = min(self.ms.get(e.instance_id, 1e18) for e in candidates)
        return {e.instance_id: float(self.ms.get(e.instance_id) == best) for e in candidates}


SNAP = EndpointSnapshot(
    [ep("p1", role="prefill"), ep("p2", role="prefill"), ep("d1", role="decode")]
)


# predicted TTFT of the decode engine and of the two prefill engines -> the pick's prefill
CYCLE = [
    ({"d1": 500.0, "p1": 900.0, "p2": 100.0}, "p2"),  # the prefill side's best pick is faster
    ({"d1": 500.0, "p1": 100.0, "p2": 900.0}, "p1"),
    ({"d1": 500.0, "p1": 700.0, "p2": 900.0}, None),  # no prefill engine beats local
]


@pytest.mark.parametrize(
    ("ms", "expected"), CYCLE, ids=["second-prefill-faster", "first-prefill-faster", "local"]
)
def test_cycle_runs_the_prefill_profile_before_deciding(
    ms: dict[str, float], expected: str | None
) -> None:
    pred = Predict("pred", ms)
    d = Profile(
        "d", preparers=(pred,), scorers=((pred, 1.0),), decider=decider(), prefill_profile="p"
    )
    p = Profile("p", preparers=(pred,), scorers=((pred, 1.0),))
    s = Scheduler({"d": d, "p": p}, "d", random.Random(0), decode_can_prefill=True)
    out = s.schedule(req(prompt_tokens=4000), SNAP, now=0.0)  # transfer: 50 ms
    assert isinstance(out, Pick)
    assert out.decode.endpoint.instance_id == "d1"
    assert (out.prefill.endpoint.instance_id if out.prefill else None) == expected
    if expected is None:  # a local pick reports the decode engine's prediction
        assert out.predicted_ttft_ms == ms["d1"]


def test_config_loads_pd_price_and_refuses_unknown_params() -> None:
    doc: dict[str, Any] = {
        "plugins": [
            {"name": "pd", "type": "pd-price", "params": {"busy_waiting": 1, "stall": 0.02}},
            {"name": "rr", "type": "round-robin"},
        ],
        "profiles": {
            "d": {"plugins": ["rr", "pd"], "prefill_profile": "p"},
            "p": {"plugins": ["rr"]},
        },
        "default_profile": "d",
    }
    s = load_config(doc, env=ENV)
    assert s.profiles["d"].decider is not None
    doc["plugins"][0]["params"] = {"threshold": 5}
    with pytest.raises(ConfigError):
        load_config(doc, env=ENV)
    doc["plugins"][0] = {"name": "pd", "type": "pd-priced"}
    with pytest.raises(ConfigError):
        load_config(doc, env=ENV)
