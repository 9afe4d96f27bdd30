"""Bench prompts built of a model's single-token words (``tideserve bench --model-path``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.bench.client import BenchError, model_words
from services.common.bench.prompts import PromptSynthesizer
from services.common.bench.traces import TraceRequest
from services.common.tokens import load_model_tokenizer
from tests.helpers.model_dir import write_model_dir

BLOCK = 16


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model_dir(tmp_path_factory.mktemp("model"))


def _req(index: int, n: int, hash_ids: list[int] | None) -> TraceRequest:
    return TraceRequest(
        index=index,
        line=index + 1,
        arrival_s=0.0,
        input_length=n,
        output_length=1,
        hash_ids=hash_ids,
    )


@pytest.mark.parametrize(
    ("a", "b", "shared_blocks"),
    [([1, 2, 3], [1, 2, 9], 2), ([1, 2], [7, 2], 0), ([5, 6, 7], [5, 6, 7], 3)],
    ids=["diverge-at-3", "diverge-at-start", "same"],
)
def test_model_prompts_keep_the_trace_prefix_structure_in_model_tokens(
    model_dir: Path, a: list[int], b: list[int], shared_blocks: int
) -> None:
    tok = load_model_tokenizer(model_dir)
    synth = PromptSynthesizer(seed=3, block_tokens=BLOCK, words=model_words(str(model_dir)))
    # after a leading space every word is one model token: a block is BLOCK tokens
    ids_a = tok.encode(" " + synth.prompt(_req(0, BLOCK * len(a), a)))[1:]
    ids_b = tok.encode(" " + synth.prompt(_req(1, BLOCK * len(b), b)))[1:]
    assert len(ids_a) == BLOCK * len(a) and len(ids_b) == BLOCK * len(b)
    common = next((i for i, (x, y) in enumerate(zip(ids_a, ids_b, strict=True)) if x != y), None)
    assert (len(ids_a) if common is None else common) // BLOCK == shared_blocks


def test_model_prompts_are_deterministic_and_the_default_is_unchanged(model_dir: Path) -> None:
    words = model_words(str(model_dir))
    req = _req(4, 40, None)
    assert PromptSynthesizer(words=words).prompt(req) == PromptSynthesizer(words=words).prompt(req)
    assert PromptSynthesizer().prompt(req).split()[0] == "u0.4.0"
    assert model_words(None) is None


def test_unusable_model_path_is_a_bench_error(tmp_path: Path) -> None:
    with pytest.raises(BenchError, match="does not exist"):
        model_words(str(tmp_path / "nope"))
