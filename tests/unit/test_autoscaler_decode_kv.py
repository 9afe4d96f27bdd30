"""Decode sizing bounded by KV memory as well as by the step time (table-driven).

The perf model of the planner's tests: a decode step is 10 ms + 0.5 ms per sequence + 0.1 ms
per 1,000 context tokens; 10 req/s of 1,000 in / 100 out tokens at TPOT 50 ms needs 0.76
decode replicas at a step-bound batch of 66 (no headroom; a context of 1,050 tokens per
sequence): 50 sequences in flight at 50 ms a token. A KV-bound batch ``b`` steps in
``10 + 0.5 b + 0.105 b`` ms, so fewer are in flight: at ``b = 10``, 16.05 ms a token, 16.05
sequences, 1.605 replicas.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from services.common.perfcoef import Coefficients
from services.common.perfmodel import get_profile
from services.common.planner import PerfView, PlannerInputs, WindowView
from services.common.planner.capacity import Demand, Targets, decode_need
from services.common.planner.core import perf_for
from services.common.planner.spec import parse_spec

PERF = PerfView(Coefficients(0.0, 0.1, 0.0, 10.0, 0.5, 0.1, 0.0, 0.0))
DEMAND = Demand(rate_rps=10.0, input_tokens=1000, output_tokens=100)
TARGETS = Targets(ttft_ms=1000.0, tpot_ms=50.0)
CTX = 1050


@pytest.mark.parametrize(
    ("kv_tokens", "batch", "feasible", "kv_bound", "replicas"),
    [
        (0, 66, True, False, 50 / 66),
        (66 * CTX, 66, True, False, 50 / 66),
        (100 * CTX, 66, True, False, 50 / 66),
        (10 * CTX, 10, True, True, 1.605),
        (CTX, 1, True, True, 10.605),
        (CTX - 1, 0, False, True, None),
    ],
    ids=["unknown", "exactly-the-step-batch", "roomy", "kv-bound", "one-sequence", "context-too-long"],
)  # fmt: skip
def test_a_replica_holds_the_batch_its_kv_fits(
    kv_tokens: int, batch: int, feasible: bool, kv_bound: bool, replicas: float | None
) -> None:
    need = decode_need(replace(PERF, kv_tokens=kv_tokens), DEMAND, TARGETS, 1.0)
    assert need.feasible is feasible
    assert f"/ batch {batch} " in need.detail and ("KV-bound" in need.detail) is kv_bound
    if replicas is not None:  # the concurrency at the step the batch runs, over the batch
        assert need.replicas == pytest.approx(replicas)


def _inputs(perf_profile: str, fitted: PerfView) -> PlannerInputs:
    spec = parse_spec({"name": "d", "perf_profile": perf_profile,
                       "roles": [{"name": "w", "role": "worker", "replicas": 1, "max_replicas": 4}]})  # fmt: skip
    return PlannerInputs(spec=spec, desired={"w": 1}, instances=(), window=WindowView(0, 0.0, 0.0, 0.0),
                         perf={"worker": fitted})  # fmt: skip


@pytest.mark.parametrize(
    ("perf_profile", "fitted_kv", "want"),
    [
        ("h200-llama3.1-8b", 0, get_profile("h200-llama3.1-8b").kv_capacity_tokens),
        ("h200-llama3.1-8b", 12_345, 12_345),
        ("", 0, 0),
    ],
    ids=["prior-fills-in", "fitted-kept", "no-prior"],
)  # fmt: skip
def test_a_fitted_model_takes_its_kv_capacity_from_the_prior(
    perf_profile: str, fitted_kv: int, want: int
) -> None:
    perf, source = perf_for(_inputs(perf_profile, replace(PERF, kv_tokens=fitted_kv)), "worker")
    assert source == "fitted" and perf is not None and perf.kv_capacity_tokens == want
