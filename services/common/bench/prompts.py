"""Deterministic prompt synthesis that preserves a trace's prefix structure.

Contract (pure, no randomness from the process): the prompt of a request depends only on
the request's fields, the seed and the block size, so it is identical across processes and
runs. With the shared tokenizer (``services.common.tokens``: one token per
whitespace-separated word):

* Mooncake (``hash_ids`` present): block ``h`` is ``block_tokens`` words
  ``s{seed:x}.{h:x}.{i:x}`` for ``i`` in ``0..block_tokens-1``, joined by single spaces. A
  prompt is its blocks in order, the last one truncated so the prompt has exactly
  ``input_length`` tokens. Equal hash ids give equal token blocks, hence equal prefixes;
  distinct ids give distinct words (and, up to crc32 collisions of whole 512-word
  sequences, distinct token blocks).
* Azure (no hash ids): ``input_length`` words ``u{seed:x}.{index:x}.{i:x}``, unique per
  request index, so no two requests share a prefix.

With a model's tokenizer (``tideserve bench --model-path DIR``, the directory the gateway and
the engines tokenize with), those words would be several tokens each. The synthesizer then
draws every word from the model's single-token words
(:meth:`services.common.tokens.ModelTokenizer.single_token_words`: one token each after a
space) with a PRNG keyed by the same name (``s{seed:x}.{h:x}`` per block, ``u{seed:x}.{index:x}``
per Azure request; ``random.Random`` of a string is the same in every process), so a block
is still ``block_tokens`` tokens (give or take the prompt's first word, which follows no
space) and equal hash ids still give equal blocks.

The engine applies its chat template around the user message, which may add a few tokens
(role markers) before and after the prompt; the ``usage.prompt_tokens`` an engine reports can
therefore exceed ``input_length`` by that constant (the built-in engine simulator renders
``"user: <prompt>"``: one extra token; real engines add their model's template, typically
5-30 tokens). It shifts every prompt by the same amount, so the prefix structure is unchanged,
but the engine's KV pages no longer align with the trace's 512-token blocks; ``--api
completions`` sends the bare prompt instead.

Memory: prompts can be 100K+ tokens, so text is built per request when it is sent, and block
strings are cached by hash id in a bounded LRU.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Sequence

from services.common.bench.traces import MOONCAKE_BLOCK_TOKENS, TraceRequest


class PromptSynthesizer:
    """Builds prompt text for trace requests; see the module docstring for the contract."""

    def __init__(
        self,
        seed: int = 0,
        block_tokens: int = MOONCAKE_BLOCK_TOKENS,
        cache_blocks: int = 4096,
        words: Sequence[str] | None = None,
    ) -> None:
        """``words``: the model's single-token words (None = the whitespace tokenizer's
        numbered words; see the module doc)."""
        if block_tokens <= 0:
            raise ValueError(f"block_tokens must be positive, got {block_tokens}")
        if seed < 0:
            raise ValueError(f"seed must be >= 0, got {seed}")
        self.seed = seed
        self.words = tuple(words) if words else None
        self.block_tokens = block_tokens
        self._cache_blocks = max(0, cache_blocks)
        self._blocks: OrderedDict[int, str] = OrderedDict()

    def block_text(self, hash_id: int) -> str:
        """The full block for ``hash_id``: exactly ``block_tokens`` words."""
        cached = self._blocks.get(hash_id)
        if cached is not None:
            self._blocks.move_to_end(hash_id)
            return cached
        text = self._words(f"s{self.seed:x}.{hash_id:x}.", self.block_tokens)
        if self._cache_blocks:
            self._blocks[hash_id] = text
            if len(self._blocks) > self._cache_blocks:
                self._blocks.popitem(last=False)
        return text

    def prompt(self, req: TraceRequest) -> str:
        """The prompt text of ``req``: exactly ``req.input_length`` words."""
        if req.hash_ids is None:
            return self._words(f"u{self.seed:x}.{req.index:x}.", req.input_length)
        parts: list[str] = []
        remaining = req.input_length
        for h in req.hash_ids:
            if remaining <= 0:
                break
            block = self.block_text(h)
            if remaining >= self.block_tokens:
                parts.append(block)
            else:
                parts.append(_first_words(block, remaining))
            remaining -= self.block_tokens
        if remaining > 0:
            raise ValueError(
                f"request {req.index} needs {req.input_length} tokens but has only "
                f"{len(req.hash_ids)} blocks of {self.block_tokens}"
            )
        return " ".join(parts)

    def _words(self, prefix: str, n: int) -> str:
        """``n`` words named by ``prefix``: numbered, or drawn from the model's words."""
        if self.words is None:
            return " ".join(f"{prefix}{i:x}" for i in range(n))
        rng = random.Random(prefix)
        return " ".join(rng.choices(self.words, k=n))

    @property
    def cached_blocks(self) -> int:
        return len(self._blocks)


def _first_words(text: str, n: int) -> str:
    """The first ``n`` space-separated words of ``text`` (single spaces, n >= 1)."""
    pos = -1
    for _ in range(n):
        pos = text.find(" ", pos + 1)
        if pos < 0:
            return text
    return text[:pos]
