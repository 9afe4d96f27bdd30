"""The performance-model fit: converges to a profile's true times from noisy samples with
outliers, starting from another profile's prior; confidence rises with samples; the prior
serves while there are too few."""

from __future__ import annotations

import numpy as np
import pytest
from tideserve.v1 import common_pb2, events_pb2

from services.common.perfcoef import prior_coefficients
from services.common.perfmodel import get_profile
from services.telemetry.model.fit import FitConfig, RoleSamples, fit_role
from services.telemetry.model.robust import lstsq_nonneg
from services.telemetry.model.state import ModelState

TRUE = get_profile("test")
PRIOR = prior_coefficients(get_profile("h200-llama3.1-8b"))  # a wrong prior on purpose
CFG = FitConfig(min_samples=50, confident_samples=200)
QUEUED_MS_PER_TOKEN = TRUE.prefill_ms(4096) / 4096


def _samples(n: int, *, outliers: float, seed: int = 1) -> RoleSamples:
    rng = np.random.default_rng(seed)
    s = RoleSamples(4000)
    for _ in range(n):
        u = int(rng.integers(16, 6000))
        q = int(rng.integers(0, 8000)) if rng.random() < 0.5 else 0
        y = TRUE.prefill_ms(u) + q * QUEUED_MS_PER_TOKEN
        # the contract's decode formula is linear: the memory-bound region (for "test",
        # below ~12 sequences; compute binds beyond)
        b = int(rng.integers(1, 12))
        ctx = b * int(rng.integers(100, 4000))
        itl = TRUE.decode_step_ms(b, ctx)
        noise = rng.lognormal(0.0, 0.05, size=2)
        if rng.random() < outliers:
            noise *= 5.0  # a preempted / paused request
        s.prefill.append((u, q, y * noise[0]))
        s.decode.append((b, ctx, itl * noise[1]))
    return s


@pytest.mark.parametrize("outliers", [0.0, 0.05, 0.15], ids=["clean", "5pct-outliers", "15pct"])
def test_fit_converges_to_the_true_profile(outliers: float) -> None:
    fit = fit_role(_samples(2000, outliers=outliers), PRIOR, CFG, now_ms=1)
    c = fit.coefficients
    for u in (64, 512, 2048, 8000):
        assert c.prefill_ms(u) == pytest.approx(TRUE.prefill_ms(u), rel=0.06), u
    assert c.prefill_ms(512, 4096) == pytest.approx(
        TRUE.prefill_ms(512) + 4096 * QUEUED_MS_PER_TOKEN, rel=0.06
    )
    for b, ctx in ((1, 500), (6, 12_000), (11, 40_000)):
        assert c.decode_step_ms(b, ctx) == pytest.approx(TRUE.decode_step_ms(b, ctx), rel=0.06)
    assert fit.prefill.samples == 2000 and fit.prefill.confidence > 0.8
    assert fit.prefill.error < 0.1 + outliers


def test_confidence_rises_with_samples() -> None:
    confs = [fit_role(_samples(n, outliers=0.05), PRIOR, CFG, 0).prefill.confidence
             for n in (10, 60, 150, 400)]  # fmt: skip
    assert confs[0] == 0.0
    assert confs == sorted(confs) and confs[-1] > confs[1]


@pytest.mark.parametrize("n", [0, 49], ids=["empty", "below-min-samples"])
def test_the_prior_serves_until_min_samples(n: int) -> None:
    fit = fit_role(_samples(n, outliers=0.0), PRIOR, CFG, 0)
    assert fit.coefficients == PRIOR
    assert fit.prefill.confidence == 0.0 and fit.prefill.samples == n
    assert fit.startup_s == CFG.startup_prior_s and fit.startup_samples == 0


def _record(**kw: object) -> events_pb2.RequestRecord:
    base: dict[str, object] = dict(
        request_id="r", deployment="d", outcome=events_pb2.REQUEST_OUTCOME_OK,
        decode_instance="e1", prompt_tokens=1000, cached_tokens=200, completion_tokens=11,
        ttft_ms=50.0, queue_ms=5.0, tpot_ms=2.0, engine_pending_prefill_tokens=300,
        engine_running=3,
    )  # fmt: skip
    base.update(kw)
    return events_pb2.RequestRecord(**base)  # type: ignore[arg-type]


W, P, D = common_pb2.ROLE_WORKER, common_pb2.ROLE_PREFILL, common_pb2.ROLE_DECODE


@pytest.mark.parametrize(
    ("record", "prefill_key", "prefill", "decode_key", "decode"),
    [
        (_record(), ("d", W), (800.0, 300.0, 45.0), ("d", W), (4.0, 4 * 1005.5, 2.0)),
        (
            _record(disaggregated=True, prefill_instance="p1", kv_transfer_ms=3.0),
            ("d", P), (800.0, 300.0, 45.0), ("d", D), (4.0, 4 * 1005.5, 2.0),
        ),
        (_record(completion_tokens=1), ("d", W), (800.0, 300.0, 45.0), ("d", W), None),
        (_record(outcome=events_pb2.REQUEST_OUTCOME_SHED), None, None, None, None),
    ],
    ids=["aggregated", "disaggregated", "one-token", "shed"],
)  # fmt: skip
def test_record_samples(
    record: events_pb2.RequestRecord,
    prefill_key: tuple[str, int] | None,
    prefill: tuple[float, ...] | None,
    decode_key: tuple[str, int] | None,
    decode: tuple[float, ...] | None,
) -> None:
    st = ModelState(CFG, kv_bytes_per_token=4096, block_size=64)
    st.observe_record(record)
    got_p = [(k, x) for k, s in st.samples.items() for x in s.prefill]
    got_d = [(k, x) for k, s in st.samples.items() for x in s.decode]
    assert got_p == ([(prefill_key, prefill)] if prefill else [])
    assert got_d == ([(decode_key, decode)] if decode else [])
    if record.kv_transfer_ms:
        assert list(st.samples[("d", P)].transfer) == [(1000 * 4096.0, 3.0)]


def test_startup_from_membership() -> None:
    st = ModelState(CFG, kv_bytes_per_token=4096, block_size=64)
    inst = common_pb2.Instance(instance_id="e9", deployment="d", role=W, epoch=1)
    inst.state = common_pb2.INSTANCE_STATE_STARTING
    st.observe_membership(events_pb2.MembershipEvent(kind=1, instance=inst, ts_ms=1000))
    inst.state = common_pb2.INSTANCE_STATE_READY
    st.observe_membership(events_pb2.MembershipEvent(kind=2, instance=inst, ts_ms=31_000))
    st.observe_membership(events_pb2.MembershipEvent(kind=2, instance=inst, ts_ms=99_000))
    fit = fit_role(st.samples[("d", W)], PRIOR, CFG, 0)
    assert (fit.startup_s, fit.startup_samples) == (30.0, 1)


@pytest.mark.parametrize(
    ("kind", "label", "samples"),
    [(1, "2500", [2.5]), (2, "2500", []), (1, "", []), (1, "0", []), (1, "n/a", [])],
    ids=["added-ready-measured", "modified-not-a-start", "no-label", "zero", "garbage"],
)
def test_startup_measured_by_the_driver(kind: int, label: str, samples: list[float]) -> None:
    """The autoscaler announces an instance only once READY, with its measured start-up."""
    st = ModelState(CFG, kv_bytes_per_token=4096, block_size=64)
    inst = common_pb2.Instance(instance_id="e9", deployment="d", role=W, epoch=0)
    inst.state = common_pb2.INSTANCE_STATE_READY
    if label:
        inst.labels["startup_ms"] = label
    st.observe_membership(events_pb2.MembershipEvent(kind=kind, instance=inst, ts_ms=5000))
    got = st.samples[("d", W)].startup if ("d", W) in st.samples else []
    assert list(got) == samples


@pytest.mark.parametrize(
    ("a", "b", "want"),
    [
        ([[1, 0], [0, 1]], [2, 3], [2, 3]),  # unbounded optimum feasible
        ([[1, 0], [0, 1]], [2, -3], [2, 0]),
        ([[1, 1], [1, 2], [1, 3]], [3, 2, 1], [2, 0]),  # falling line: flat at the mean
        ([[1, 0], [0, 1]], [-1, -1], [0, 0]),
    ],
    ids=["feasible", "one-bound", "slope-bound", "all-bound"],
)
def test_bounded_least_squares(a: list[list[float]], b: list[float], want: list[float]) -> None:
    got = lstsq_nonneg(np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64))
    assert got == pytest.approx(want, abs=1e-9)


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_short_mostly_cached_prompts_never_fit_a_negative_prefill(seed: int) -> None:
    """Prompts of 1-2 uncached tokens (a chat turn on a warm cache) leave the n^2 and n
    columns nearly constant: unbounded, each of these seeds fits a negative n^2 term that
    prices 4,096 tokens below 0 ms. Bounded, every coefficient is >= 0."""
    rng = np.random.default_rng(seed)
    s = RoleSamples(4000)
    for _ in range(300):
        n = int(rng.integers(1, 3))
        s.prefill.append((n, 0, 5.0 * float(rng.lognormal(0.0, 0.3))))
    fit = fit_role(s, PRIOR, CFG, now_ms=1)
    c = fit.coefficients
    assert min(c.prefill_base_ms, c.prefill_ms_per_token, c.prefill_ms_per_token2) >= 0.0
    assert c.prefill_ms(4096) > 0.0 and fit.prefill.confidence > 0.0
