"""The bench's prompt for a trace request, as the simulators build it (pure)."""

from __future__ import annotations

from services.bench.prompts import PromptSynthesizer
from services.bench.traces import TraceRequest
from services.common.tokens import tokenize

__all__ = ["Prompts"]


class Prompts:
    """The bench's prompt for a trace request, tokenized as the gateway and engine see it."""

    def __init__(self, block_tokens: int) -> None:
        self.synth = PromptSynthesizer(0, block_tokens)
        self.role = tokenize("user:")
        self._blocks: dict[int, list[int]] = {}

    def tokens(self, r: TraceRequest) -> tuple[int, ...]:
        out = list(self.role)
        remaining = r.input_length
        for h in r.hash_ids or ():
            if remaining <= 0:
                break
            blk = self._blocks.get(h)
            if blk is None:
                blk = self._blocks[h] = tokenize(self.synth.block_text(h))
            out.extend(blk[:remaining])
            remaining -= len(blk)
        if remaining > 0:  # traces without hash ids: unique words
            out.extend(tokenize(self.synth.prompt(r))[r.input_length - remaining :])
        return tuple(out)
