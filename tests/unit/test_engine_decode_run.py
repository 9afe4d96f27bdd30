"""Decode runs (``EngineCore.decode_run``): the steps a run stands for are exactly the
single steps ``step`` would run, and a run is refused whenever the next step is not a pure
decode that changes nothing but token counts."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from services.common.engine_core.core import CoreConfig, EngineCore, Request
from services.common.engine_core.kvcache import KVCache
from services.common.perfmodel import get_profile

PROFILE = get_profile("test")


@dataclass(frozen=True)
class Case:
    outs: tuple[int, ...]  # max_new_tokens of each running request
    mark: int = 0
    blocks: int = 1024
    waiting: int = 0  # prompt length of one more request submitted after the others
    max_batch: int = 8


def core_with(case: Case, token_ids: bool) -> tuple[EngineCore, float]:
    """A core whose ``case.outs`` requests are all decoding; the time it got there."""
    cfg = CoreConfig(max_batch=case.max_batch, max_batched_tokens=256, token_ids=token_ids)
    core = EngineCore(cfg, PROFILE, KVCache(case.blocks, 16))
    for i, out in enumerate(case.outs):
        core.submit(Request(f"r{i}", tuple(range(1000 * i, 1000 * i + 40)), out), 0.0)
    now = 0.0
    while core.pending_prefill_tokens() or core.num_waiting:
        res = core.step(now)
        assert res is not None
        now += res.duration_ms
    if case.waiting:
        core.submit(Request("late", tuple(range(90_000, 90_000 + case.waiting)), 4), now)
    return core, now


@pytest.mark.parametrize(
    ("case", "steps"),
    [
        (Case((30, 50, 70)), 28),  # the first to finish ends it (its last step is a step)
        (Case((30, 50, 70), mark=16), 14),  # the first chunk of 16 tokens ends it earlier
        (Case((5,)), 3),
        (Case((200, 200), blocks=30, waiting=300), 198),  # the head cannot fit: runs on
        (Case((200, 200), max_batch=2, waiting=40), 198),  # the batch is full: runs on
    ],
    ids=["finish", "mark", "short", "head-blocked", "batch-full"],
)
def test_a_run_is_the_single_steps_it_stands_for(case: Case, steps: int) -> None:
    batched, start = core_with(case, token_ids=False)
    single, _ = core_with(case, token_ids=True)
    run = batched.decode_run(start, case.mark)
    assert run is not None and run.steps == steps
    assert batched.apply_run(run) == tuple(f"r{i}" for i in range(len(case.outs)))
    now = start
    for _ in range(steps):
        res = single.step(now)
        assert res is not None and res.prefill_tokens == 0
        assert not any(o.finished for o in res.outputs)
        now += res.duration_ms
    assert run.end == pytest.approx(now, rel=1e-12)
    # the next step is the same on both: what the run stopped before
    a, b = batched.step(run.end), single.step(now)
    assert a is not None and b is not None
    assert a.duration_ms == pytest.approx(b.duration_ms, rel=1e-12)
    assert [(o.rid, o.completion_tokens, o.finished) for o in a.outputs] == [
        (o.rid, o.completion_tokens, o.finished) for o in b.outputs
    ]
    assert batched.generation_tokens_total == single.generation_tokens_total


@pytest.mark.parametrize(
    "case",
    [Case((30, 50), waiting=40), Case((30, 2)), Case((30, 50), mark=2)],
    ids=["head-fits", "one-finishes-next", "mark-reached"],
)
def test_no_run_when_the_next_step_is_more_than_decoding(case: Case) -> None:
    core, now = core_with(case, token_ids=False)
    assert core.decode_run(now, case.mark) is None


def test_a_cut_run_ends_at_the_first_step_end_from_the_submit() -> None:
    core, start = core_with(Case((100, 100)), token_ids=False)
    run = core.decode_run(start)
    assert run is not None and run.steps == 98
    one = PROFILE.decode_steps_ms(run.batch, run.context, 1)
    assert core.cut_run(run, start).steps == 1
    assert core.cut_run(run, start + 10.5 * one).steps == 11
    assert core.cut_run(run, run.end) is run
    assert core.run_started(run, start + 10.5 * one) == 11
