"""The first streamed chunk in the planner's sizing (table-driven): engines that coalesce k
tokens per chunk make TTFT hold k - 1 decode steps, so the decode step is bounded by a share
of the TTFT target as well as by the TPOT budget, and the prefill gets what is left.

The perf model of the planner's tests: a decode step is 10 ms + 0.5 ms per sequence + 0.1 ms
per 1,000 context tokens (about 10 + 0.605 b ms for b sequences of 1,050 tokens); a prefill
is 0.1 ms per token.
"""

from __future__ import annotations

import pytest

from services.common.perfcoef import Coefficients
from services.common.planner import PerfView
from services.common.planner.capacity import (
    Demand,
    FirstChunk,
    Targets,
    decode_need,
    prefill_need,
)

PERF = PerfView(Coefficients(0.0, 0.1, 0.0, 10.0, 0.5, 0.1, 0.0, 0.0))
DEMAND = Demand(rate_rps=40.0, input_tokens=1000, output_tokens=100)


@pytest.mark.parametrize(
    ("first", "targets", "step", "prefill_target"),
    [
        (FirstChunk(1), Targets(1000.0, 50.0), 50.0, 1000.0),
        (FirstChunk(16), Targets(1000.0, 50.0), 500.0 / 15, 500.0),
        (FirstChunk(16), Targets(3000.0, 50.0), 50.0, 3000.0 - 15 * 50.0),
        (FirstChunk(16, share=0.25), Targets(1000.0, 50.0), 250.0 / 15, 750.0),
        (FirstChunk(16), Targets(0.0, 50.0), 50.0, 0.0),
        (FirstChunk(16), Targets(1000.0, 0.0), 500.0 / 15, 500.0),
        (FirstChunk(1), Targets(0.0, 0.0), None, 0.0),
    ],
    ids=["one-token-chunks", "ttft-binds-the-step", "tpot-binds-the-step", "smaller-share",
         "no-ttft-target", "no-tpot-target", "no-targets"],
)  # fmt: skip
def test_the_ttft_target_is_split(
    first: FirstChunk, targets: Targets, step: float | None, prefill_target: float
) -> None:
    assert first.step_budget_ms(targets, 1.0) == pytest.approx(step)
    assert first.prefill_target_ms(targets, 1.0) == pytest.approx(prefill_target)


@pytest.mark.parametrize(
    ("tokens", "targets", "batch", "named"),
    [(1, Targets(1000.0, 50.0), 66, False),
     (16, Targets(1000.0, 50.0), 38, True),
     (16, Targets(1000.0, 0.0), 38, True),
     (16, Targets(3000.0, 50.0), 66, False)],
    ids=["tpot-batch", "first-chunk-batch", "first-chunk-no-tpot-target", "tpot-binds"],
)  # fmt: skip
def test_decode_batch_fits_the_first_chunk(
    tokens: int, targets: Targets, batch: int, named: bool
) -> None:
    need = decode_need(PERF, DEMAND, targets, 1.0, FirstChunk(tokens))
    assert need.feasible
    assert f"/ batch {batch} " in need.detail
    assert ("first chunk" in need.detail) is named


def test_prefill_is_sized_for_what_the_first_chunk_leaves() -> None:
    targets = Targets(400.0, 50.0)
    one = prefill_need(PERF, DEMAND, targets, 0.85, FirstChunk(1), 1.0)
    sixteen = prefill_need(PERF, DEMAND, targets, 0.85, FirstChunk(16), 1.0)
    # 40 req/s x 100 ms: 4 busy replicas. One-token chunks leave 300 ms of waiting: 5 keep
    # its p90 there (ErlangC 0.55 x e^-3). Sixteen leave 400 - 15 x 200/15 = 200 ms, 100 of
    # waiting: 5 miss it (0.55 x e^-1 = 0.20 > 0.1), 6 do not (0.29 x e^-2 = 0.04).
    assert (one.replicas, sixteen.replicas) == (5.0, 6.0)
    assert one.feasible and sixteen.feasible


def test_a_first_chunk_longer_than_the_ttft_target_is_infeasible() -> None:
    # 15 steps of at least 10.6 ms (batch 1) cannot fit in half of a 300 ms target
    need = decode_need(PERF, DEMAND, Targets(300.0, 50.0), 1.0, FirstChunk(16))
    assert not need.feasible
