"""Prompt synthesis: exact lengths, equal hash ids give equal blocks, stable across processes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from services.common import tokens
from services.common.bench.prompts import PromptSynthesizer
from services.common.bench.traces import TraceRequest, load_trace

DATA = Path(__file__).resolve().parents[1] / "data"


def _req(index: int, n_in: int, ids: tuple[int, ...] | None) -> TraceRequest:
    return TraceRequest(
        index=index, line=index + 1, arrival_s=0.0, input_length=n_in, output_length=1, hash_ids=ids
    )


def test_each_block_is_exactly_512_tokens_and_distinct_ids_give_distinct_blocks() -> None:
    synth = PromptSynthesizer(seed=0)
    blocks = {h: tuple(tokens.tokenize(synth.block_text(h))) for h in range(300)}
    assert all(len(b) == 512 for b in blocks.values())
    assert len(set(blocks.values())) == len(blocks)
    # Same id, same block (also when recomputed after the cache dropped it).
    assert (
        tuple(tokens.tokenize(PromptSynthesizer(seed=0, cache_blocks=0).block_text(7)))
        == (blocks[7])
    )


@pytest.mark.parametrize(
    ("a", "b", "shared_blocks"),
    [
        (_req(0, 1500, (0, 1, 2)), _req(1, 1536, (0, 1, 3)), 2),
        (_req(0, 1024, (0, 1)), _req(1, 2000, (0, 1, 5, 6)), 2),
        (_req(0, 600, (4, 9)), _req(1, 600, (5, 9)), 0),
        (_req(0, 1000, (0, 1)), _req(1, 1000, (0, 1)), 1),
    ],
    ids=["diverge-in-block-3", "extension", "diverge-at-start", "same-ids-partial-tail"],
)
def test_equal_hash_id_prefixes_give_equal_token_prefixes(
    a: TraceRequest, b: TraceRequest, shared_blocks: int
) -> None:
    synth = PromptSynthesizer(seed=3)
    ta, tb = tokens.tokenize(synth.prompt(a)), tokens.tokenize(synth.prompt(b))
    assert (len(ta), len(tb)) == (a.input_length, b.input_length)
    ha, hb = tokens.block_hashes(ta, 512), tokens.block_hashes(tb, 512)
    common = 0
    while common < min(len(ha), len(hb)) and ha[common] == hb[common]:
        common += 1
    assert common == shared_blocks


def test_seed_changes_every_block() -> None:
    a = tokens.tokenize(PromptSynthesizer(seed=0).block_text(1))
    b = tokens.tokenize(PromptSynthesizer(seed=1).block_text(1))
    assert a[0] != b[0] and a != b


def test_azure_prompts_are_unique_per_request_and_exact_length() -> None:
    synth = PromptSynthesizer(seed=0)
    p0, p1 = synth.prompt(_req(0, 300, None)), synth.prompt(_req(1, 300, None))
    t0, t1 = tokens.tokenize(p0), tokens.tokenize(p1)
    assert len(t0) == len(t1) == 300
    assert t0[0] != t1[0]


def test_block_cache_is_bounded() -> None:
    synth = PromptSynthesizer(seed=0, cache_blocks=8)
    synth.prompt(_req(0, 512 * 20, tuple(range(20))))
    assert synth.cached_blocks == 8


def test_prompts_of_the_real_slice_are_identical_in_another_process() -> None:
    trace = load_trace(DATA / "mooncake_conversation_head.jsonl")
    synth = PromptSynthesizer(seed=5)
    here = [
        tokens.block_hashes(tokens.tokenize(synth.prompt(r)), 512)[-1:] for r in trace.requests[:20]
    ]
    code = (
        "import sys\n"
        "from services.common.bench.prompts import PromptSynthesizer\n"
        "from services.common.bench.traces import load_trace\n"
        "from services.common import tokens\n"
        "t = load_trace(sys.argv[1]); s = PromptSynthesizer(seed=5)\n"
        "print([tokens.block_hashes(tokens.tokenize(s.prompt(r)), 512)[-1:] "
        "for r in t.requests[:20]])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(DATA / "mooncake_conversation_head.jsonl")],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == str(here)
    assert all(h for h in here)  # every request has at least one full block to compare
