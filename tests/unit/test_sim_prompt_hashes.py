"""A prompt's block hashes taken partly from an earlier prompt with the same leading hash
ids (``Prompts.block_hashes``) are the hashes of its bytes."""

from __future__ import annotations

import pytest

from services.common.bench.traces import TraceRequest
from services.common.tokens import payload_block_hashes
from services.sim.inputs import Prompts

SEQUENCES = [
    [((1, 2, 3), 1536), ((1, 2, 3, 4), 2048), ((1, 2), 1024)],  # turns extend, then shrink
    [((1, 2, 3), 1000), ((1, 2, 3), 1536), ((1, 2, 3, 9), 1700)],  # the last block cut short
    [((5, 5, 6), 1300), ((5, 5, 6, 6), 2048)],  # repeated ids
    [((1, 2), 1024), ((7, 2), 1024), ((1, 7), 1024)],  # the same id after another prefix
    [((4,), 0), ((4,), 10), ((4,), 500)],  # nothing, a few tokens, most of a block
    [(None, 900), (None, 900)],  # no hash ids (Azure)
]
IDS = ["extend-shrink", "cut-short", "repeated-ids", "other-prefix", "short", "azure"]


@pytest.mark.parametrize("block_size", [16, 64], ids=["bs16", "bs64"])
@pytest.mark.parametrize("seq", SEQUENCES, ids=IDS)
def test_block_hashes_are_the_payloads(
    seq: list[tuple[tuple[int, ...] | None, int]], block_size: int
) -> None:
    p = Prompts(memo_blocks=2)  # a small memo: some chains are let go again
    for k, (ids, n) in enumerate(seq * 2):
        r = TraceRequest(k, k + 1, 0.0, n, 1, ids)
        _, payload = p.prompt(r)
        want = tuple(payload_block_hashes(payload, block_size))
        assert p.block_hashes(r, payload, block_size) == want, f"request {k}"


@pytest.mark.parametrize("block_size", [16, 64, 100], ids=["bs16", "bs64", "bs100"])
@pytest.mark.parametrize("seq", SEQUENCES, ids=IDS)
def test_a_request_is_its_prompt_and_hashes(
    seq: list[tuple[tuple[int, ...] | None, int]], block_size: int
) -> None:
    """``Prompts.request`` (a prompt by length, only its uncovered blocks made and hashed)
    gives the prompt's ids and the hashes of its bytes."""
    p, ref = Prompts(memo_blocks=2), Prompts(memo_blocks=2)
    for k, (ids, n) in enumerate(seq * 2):
        r = TraceRequest(k, k + 1, 0.0, n, 1, ids)
        toks, hashes = p.request(r, block_size)
        want, payload = ref.prompt(r)
        assert hashes == tuple(payload_block_hashes(payload, block_size)), f"request {k}"
        assert len(toks) == len(want) and toks == want and list(toks) == list(want)
        assert toks[-1:] == want[-1:]
