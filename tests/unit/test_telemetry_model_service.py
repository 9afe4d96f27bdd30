"""ModelService without I/O: records in, GetPerfModel / GetRecommendation out (proto
translation, prior vs fit, unknown deployments); /metrics pages of both dialects."""

from __future__ import annotations

import numpy as np
import pytest
from tideserve.v1 import common_pb2, events_pb2, telemetry_pb2

from services.common.perfmodel import get_profile
from services.engine.metrics import EngineMetrics, Gauges
from services.telemetry.model.scrape import decode_between, parse_engine_page
from services.telemetry.model.service import ModelService
from services.telemetry.model.settings import ModelSettings

TRUE = get_profile("test")


class FakeWindows:
    def __init__(self, total: telemetry_pb2.WindowStats) -> None:
        self.total = total
        self.asked: list[tuple[str, float, int]] = []

    def window(
        self, deployment: str, window_s: float, now_ms: int
    ) -> telemetry_pb2.QueryWindowResponse:
        self.asked.append((deployment, window_s, now_ms))
        return telemetry_pb2.QueryWindowResponse(total=self.total)


def _window(rate: float = 20.0) -> telemetry_pb2.WindowStats:
    return telemetry_pb2.WindowStats(
        request_rate_rps=rate,
        input_tokens=telemetry_pb2.Percentiles(mean=2000, p50=1500, p90=4000),
        output_tokens=telemetry_pb2.Percentiles(mean=200, p50=150, p90=400),
        cache_hit_ratio=0.25,
        classes=[telemetry_pb2.ClassAttainment(slo_class="interactive", percentile=90,
                                               ttft_target_ms=1500, tpot_target_ms=40)],
    )  # fmt: skip


def _service(**kw: object) -> ModelService:
    settings = ModelSettings(profile="h200-llama3.1-8b", deployments=["d"], **kw)  # type: ignore[arg-type]
    return ModelService(settings, windows=FakeWindows(_window()))


def _records(n: int, seed: int = 3) -> list[events_pb2.RequestRecord]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        prompt, cached = int(rng.integers(100, 5000)), int(rng.integers(0, 100))
        q = int(rng.integers(0, 3000))
        ttft = TRUE.prefill_ms(prompt - cached) + q * TRUE.prefill_ms(4096) / 4096
        out.append(events_pb2.RequestRecord(
            request_id=f"r{i}", deployment="d", outcome=events_pb2.REQUEST_OUTCOME_OK,
            decode_instance="e1", prompt_tokens=prompt, cached_tokens=cached,
            completion_tokens=50, ttft_ms=ttft * rng.lognormal(0, 0.03) + 2.0, queue_ms=2.0,
            tpot_ms=TRUE.decode_step_ms(4, 4 * (prompt + 25)) * rng.lognormal(0, 0.03),
            engine_pending_prefill_tokens=q, engine_running=3,
        ))  # fmt: skip
    return out


def test_prior_until_records_then_the_fit() -> None:
    svc = _service()
    req = telemetry_pb2.GetPerfModelRequest(deployment="d")
    prior = svc.perf_model(req, now_ms=1_000).model
    assert (prior.samples, prior.prefill_confidence, prior.role) == (0, 0.0, common_pb2.ROLE_WORKER)
    assert prior.profile == "h200-llama3.1-8b"
    svc.observe_records(2_000, _records(400))
    cached = svc.perf_model(req, now_ms=2_000).model  # within the refit interval: cached
    assert cached.samples == 0
    m = svc.perf_model(req, now_ms=10_000).model
    assert m.samples == 800 and m.prefill_confidence > 0.8 and m.fitted_ms == 10_000
    for n in (200, 2000):
        pred = m.prefill_base_ms + m.prefill_ms_per_token * n + m.prefill_ms_per_token2 * n * n
        assert pred == pytest.approx(TRUE.prefill_ms(n), rel=0.1)


@pytest.mark.parametrize(
    "call",
    [
        lambda s: s.perf_model(telemetry_pb2.GetPerfModelRequest(deployment="nope"), 0),
        lambda s: s.recommendation(telemetry_pb2.GetRecommendationRequest(deployment="nope"), 0),
    ],
    ids=["perf-model", "recommendation"],
)
def test_unknown_deployment_is_a_lookup_error(call: object) -> None:
    with pytest.raises(LookupError, match="nope"):
        call(_service())  # type: ignore[operator]


def test_recommendation_from_the_window() -> None:
    svc = _service()
    windows = svc.windows
    assert isinstance(windows, FakeWindows)
    req = telemetry_pb2.GetRecommendationRequest(deployment="d", disaggregated=True)
    r = svc.recommendation(req, now_ms=5_000)
    assert windows.asked == [("d", 300.0, 5_000)]
    assert r.prefill_replicas >= 1 and r.decode_replicas >= 1 and r.worker_replicas == 0
    assert r.request_rate_rps == 20.0 and r.cache_hit_ratio == 0.25
    assert r.binding_constraint.endswith(":interactive") or r.binding_constraint in (
        "kv-capacity", "max-batch", "min-replicas",
    )  # fmt: skip
    windows.total = _window(rate=200.0)
    big = svc.recommendation(req, now_ms=6_000)
    assert big.prefill_replicas > r.prefill_replicas
    with pytest.raises(ValueError, match="window_s"):
        svc.recommendation(telemetry_pb2.GetRecommendationRequest(deployment="d", window_s=-1), 0)


@pytest.mark.parametrize("dialect", ["sglang", "vllm"])
def test_metrics_pages_give_decode_samples(dialect: str) -> None:
    em = EngineMetrics(dialect, "m")  # type: ignore[arg-type]
    g = Gauges(num_running=8, num_waiting=0, used_tokens=12_000, kv_usage=0.3,
               cache_hit_rate=0.0, gen_throughput=0.0)  # fmt: skip
    first = parse_engine_page(em.render(g).decode())
    for _ in range(10):
        em.on_inter_token(0.004)
    second = parse_engine_page(em.render(g).decode())
    assert first is not None and second is not None
    obs = decode_between(first, second, deployment="d", instance_id="e", kv_capacity_tokens=1)
    assert obs is not None
    assert (obs.batch, obs.context_tokens) == (8, 12_000)
    assert obs.itl_ms == pytest.approx(4.0)
    assert decode_between(second, second, deployment="d", instance_id="e",
                          kv_capacity_tokens=1) is None  # fmt: skip


@pytest.mark.parametrize(
    "page", ["", "garbage {{{", "other_metric 1\n"], ids=["empty", "bad", "no-engine"]
)
def test_pages_without_engine_figures(page: str) -> None:
    assert parse_engine_page(page) is None
