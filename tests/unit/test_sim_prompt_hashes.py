"""A simulated prompt is the bench's prompt by its length, and its block hashes have the
equality of that prompt's real block hashes (``Prompts.request``)."""

from __future__ import annotations

import random
from itertools import takewhile
from typing import Any

import pytest

from services.common.bench.traces import TraceRequest
from services.common.tokens import payload_block_hashes
from services.sim.inputs import Prompts
from services.sim.trace_hashes import trace_block_hashes

SEQUENCES = [
    [((1, 2, 3), 1536), ((1, 2, 3, 4), 2048), ((1, 2), 1024)],  # turns extend, then shrink
    [((1, 2, 3), 1000), ((1, 2, 3), 1536), ((1, 2, 3, 9), 1700)],  # the last block cut short
    [((5, 5, 6), 1300), ((5, 5, 6, 6), 2048)],  # repeated ids
    [((1, 2), 1024), ((7, 2), 1024), ((1, 7), 1024)],  # the same id after another prefix
    [((4,), 0), ((4,), 10), ((4,), 500)],  # nothing, a few tokens, most of a block
    [(None, 900), (None, 900)],  # no hash ids (Azure)
]
IDS = ["extend-shrink", "cut-short", "repeated-ids", "other-prefix", "short", "azure"]


@pytest.mark.parametrize("block_size", [16, 64, 100], ids=["bs16", "bs64", "bs100"])
@pytest.mark.parametrize("seq", SEQUENCES, ids=IDS)
def test_a_request_is_its_prompt_and_hashes(
    seq: list[tuple[tuple[int, ...] | None, int]], block_size: int
) -> None:
    """``Prompts.request`` gives the prompt's ids (made when read) and, per block, a hash:
    as many as the real ones, 64-bit and non-zero, and any two prompts share exactly as
    many leading hashes as leading real hashes (their tokens' full blocks). Without hash
    ids they are the real ones."""
    p, ref = Prompts(memo_blocks=2), Prompts(memo_blocks=2)
    got: list[tuple[int, ...]] = []
    real: list[tuple[int, ...]] = []
    for k, (ids, n) in enumerate(seq * 2):
        r = TraceRequest(k, k + 1, 0.0, n, 1, ids)
        toks, hashes = p.request(r, block_size)
        want, payload = ref.prompt(r)
        assert len(toks) == len(want) and toks == want and list(toks) == list(want)
        assert toks[-1:] == want[-1:]
        truth = tuple(payload_block_hashes(payload, block_size))
        assert len(hashes) == len(truth) and all(0 < h < 1 << 64 for h in hashes)
        if ids is None:
            assert hashes == truth, f"request {k}"
        got.append(hashes)
        real.append(truth)
    for a in range(len(got)):
        for b in range(len(got)):
            assert _common(got[a], got[b]) == _common(real[a], real[b]), (a, b)


def _common(x: tuple[Any, ...], y: tuple[Any, ...]) -> int:
    """The length of the longest common prefix of two sequences."""
    return sum(1 for _ in takewhile(lambda pair: pair[0] == pair[1], zip(x, y, strict=False)))


@pytest.mark.parametrize(
    ("lead", "trace_block", "block_size"),
    [(3, 512, 64), (0, 512, 64), (70, 16, 64), (3, 64, 64), (100, 512, 100)],
    ids=["role-before-512", "no-role", "role-over-a-block-16", "aligned-64", "bs100"],
)
def test_trace_block_hashes_follow_the_tokens(lead: int, trace_block: int, block_size: int) -> None:
    """Against a direct model of the tokens (block ``j`` = the lead's and the trace blocks'
    token positions it covers), over random prompts sharing prefixes: equal leading hashes
    exactly where the modelled blocks are equal."""
    rng = random.Random(7)
    prompts = []
    for _ in range(40):
        ids = tuple(rng.choice((1, 2, 3)) for _ in range(rng.randint(1, 6)))
        n = rng.randint(0, len(ids) * trace_block)
        prompts.append((ids[: -(-n // trace_block)] if n else (), lead + n))

    def blocks(ids: tuple[int, ...], tokens: int) -> list[tuple[tuple[int, int], ...]]:
        toks = [(-1, i) for i in range(lead)]
        toks += [(ids[t // trace_block], t % trace_block) for t in range(tokens - lead)]
        return [tuple(toks[: (j + 1) * block_size]) for j in range(tokens // block_size)]

    for a_ids, a_n in prompts:
        ha = trace_block_hashes(a_ids, a_n, lead, trace_block, block_size)
        ba = blocks(a_ids, a_n)
        assert len(ha) == len(ba)
        for b_ids, b_n in prompts:
            hb = trace_block_hashes(b_ids, b_n, lead, trace_block, block_size)
            bb = blocks(b_ids, b_n)
            assert _common(ha, hb) == _common(tuple(ba), tuple(bb))
