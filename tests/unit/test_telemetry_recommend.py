"""The P/D recommendation moves the right way when the mix or the targets shift."""

from __future__ import annotations

from dataclasses import replace

import pytest

from services.common.perfcoef import prior_coefficients
from services.common.perfmodel import get_profile
from services.telemetry.model.recommend import (
    Capacity,
    Recommendation,
    SloClass,
    TrafficMix,
    recommend,
)

PROFILE = get_profile("h200-llama3.1-8b")
MODEL = prior_coefficients(PROFILE)
CAP = Capacity(PROFILE.kv_capacity_tokens, PROFILE.kv_bytes_per_token)
BASE = TrafficMix(
    rate_rps=40.0, input_mean=3000, input_p50=2000, input_p90=7000, output_mean=300,
    hit_ratio=0.3,
)  # fmt: skip
CLASSES = (SloClass("interactive", 90.0, 1000.0, 30.0), SloClass("batch", 50.0, 10_000.0, 0))


def _rec(mix: TrafficMix, classes: tuple[SloClass, ...] = CLASSES) -> Recommendation:
    return recommend(mix, classes, MODEL, MODEL, CAP, disaggregated=True)


@pytest.mark.parametrize(
    ("shifted", "more_prefill", "more_decode"),
    [
        (replace(BASE, input_mean=9000, input_p50=6000, input_p90=21000), True, None),
        (replace(BASE, output_mean=1200), False, True),
        (replace(BASE, rate_rps=160.0), True, True),
        (replace(BASE, hit_ratio=0.8), False, None),  # fewer uncached tokens: less prefill
    ],
    ids=["longer-prompts", "longer-outputs", "higher-rate", "more-cache-hits"],
)
def test_the_mix_moves_the_recommendation(
    shifted: TrafficMix, more_prefill: bool, more_decode: bool | None
) -> None:
    before, after = _rec(BASE), _rec(shifted)
    if more_prefill:
        assert after.prefill_replicas > before.prefill_replicas
    else:
        assert after.prefill_replicas <= before.prefill_replicas
    if more_decode is True:
        assert after.decode_replicas > before.decode_replicas
    elif more_decode is False:
        assert after.decode_replicas <= before.decode_replicas


def test_tighter_ttft_gives_more_prefill_and_names_it() -> None:
    tight = (SloClass("interactive", 90.0, 700.0, 30.0),)
    loose = (SloClass("interactive", 90.0, 4000.0, 30.0),)
    a, b = _rec(BASE, tight), _rec(BASE, loose)
    assert a.prefill_replicas > b.prefill_replicas
    assert a.binding == "prefill:ttft:interactive"


@pytest.mark.parametrize(
    ("tpot", "binding"),
    [(6.0, "decode:tpot:interactive"), (0.0, "kv-capacity")],
    ids=["tight-tpot", "no-tpot-target"],
)
def test_decode_binding(tpot: float, binding: str) -> None:
    mix = replace(BASE, rate_rps=20.0, input_mean=20_000, input_p50=20_000, input_p90=30_000,
                  output_mean=2000, hit_ratio=0.9)  # fmt: skip
    classes = (SloClass("interactive", 90.0, 60_000.0, tpot),)
    r = _rec(mix, classes)
    assert r.binding == binding
    assert r.pd_ratio == pytest.approx(r.prefill_replicas / r.decode_replicas)


def test_aggregated_workers_cover_both_phases() -> None:
    agg = recommend(BASE, CLASSES, MODEL, MODEL, CAP, disaggregated=False)
    pd = _rec(BASE)
    assert agg.prefill_replicas == agg.decode_replicas == 0 and agg.pd_ratio == 0.0
    assert max(pd.prefill_replicas, pd.decode_replicas) <= agg.worker_replicas
    assert agg.worker_replicas <= pd.prefill_replicas + pd.decode_replicas


@pytest.mark.parametrize("layout", [True, False], ids=["pd", "aggregated"])
def test_no_traffic_is_min_replicas(layout: bool) -> None:
    r = recommend(replace(BASE, rate_rps=0.0), CLASSES, MODEL, MODEL, CAP, disaggregated=layout)
    assert r.binding == "min-replicas"
    assert (r.prefill_replicas, r.decode_replicas, r.worker_replicas) == (
        (1, 1, 0) if layout else (0, 0, 1)
    )


def test_unmeetable_ttft_is_named_infeasible() -> None:
    r = _rec(BASE, (SloClass("interactive", 90.0, 5.0, 0.0),))
    assert r.binding == "prefill:ttft:interactive:infeasible"


def test_no_classes_is_an_error() -> None:
    with pytest.raises(ValueError, match="SLO class"):
        _rec(BASE, ())
