"""A core with ``CoreConfig.output_mark`` runs the same steps as one without it and
outputs exactly the sequences' first tokens, their ``mark``-th tokens and their ends."""

from __future__ import annotations

import random

import pytest

from services.common.engine_core.core import (
    CoreConfig,
    EngineCore,
    EngineRole,
    Request,
    SeqOutput,
)
from services.common.engine_core.kvcache import KVCache
from services.common.perfmodel import get_profile

PROFILE = get_profile("test")


def _core(role: EngineRole, mark: int | None) -> EngineCore:
    cfg = CoreConfig(role=role, max_batch=6, max_batched_tokens=96, token_ids=False,
                     output_mark=mark)  # fmt: skip
    return EngineCore(cfg, PROFILE, KVCache(256, 16))


def _kept(o: SeqOutput, mark: int, first: set[str]) -> bool:
    return o.rid not in first or o.completion_tokens == mark or o.finished


@pytest.mark.parametrize(
    "role", [EngineRole.AGGREGATED, EngineRole.PREFILL], ids=["agg", "prefill"]
)
@pytest.mark.parametrize("mark", [1, 4, 16], ids=["mark-1", "mark-4", "mark-16"])
@pytest.mark.parametrize("seed", [0, 1], ids=["seed-0", "seed-1"])
def test_a_marked_core_outputs_first_mark_and_end_only(
    role: EngineRole, mark: int, seed: int
) -> None:
    rng = random.Random(seed)
    full, sparse = _core(role, None), _core(role, mark)
    now, k = 0.0, 0
    first: set[str] = set()
    for _ in range(400):
        if rng.random() < 0.3:
            n, out = rng.randrange(1, 120), rng.randrange(1, 30)
            r = Request(f"r{k}", tuple(range(1000 + 7 * k, 1000 + 7 * k + n)), out)
            k += 1
            full.submit(r, now)
            sparse.submit(r, now)
        a, b = full.step(now), sparse.step(now)
        assert (a is None) == (b is None)
        if a is None or b is None:
            now += 1.0
            continue
        assert (a.duration_ms, a.prefill_tokens, a.decode_tokens) == (
            b.duration_ms, b.prefill_tokens, b.decode_tokens
        )  # fmt: skip
        assert b.outputs == tuple(o for o in a.outputs if _kept(o, mark, first))
        first.update(o.rid for o in a.outputs)
        assert full.generation_tokens_total == sparse.generation_tokens_total
        assert full.finished_total == sparse.finished_total
        now += a.duration_ms + 0.5
