"""A tiny model directory for tokenizer tests: a byte-level BPE trained at test time with PyPI
``tokenizers`` (no network), saved as ``tokenizer.json``, and a ``tokenizer_config.json`` with
special tokens and a chat template, as a Hugging Face snapshot lays them out."""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

__all__ = ["CHAT_TEMPLATE", "PARTS_TEMPLATE", "SPECIALS", "write_model_dir"]

SPECIALS = ["<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>"]

# Zephyr/Llama-like: BOS, one "<|role|>" header per message, EOS after each message; refuses
# unknown roles with raise_exception, as real templates do.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unknown role ' + message['role']) }}"
    "{% endif %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] | trim }}{{ eos_token }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

# A template that iterates over the content parts itself ("openai" content format).
PARTS_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}<|{{ message['role'] }}|>\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}[{{ part['text'] }}]{% endfor %}{% endif %}"
    "{{ eos_token }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

_CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "a system prompt tells the assistant to be brief and precise",
    "users ask questions about caches, blocks, prefixes and tokens",
    "hello there, how are you today? I am fine, thank you.",
    "routing requests to the engine that already holds the prefix saves prefill time",
] * 20


def write_model_dir(
    path: Path,
    template: str = CHAT_TEMPLATE,
    vocab_size: int = 400,
    *,
    added_token_form: bool = True,
    corpus: list[str] | None = None,
) -> Path:
    """Train the BPE and write the two files into ``path`` (created); returns ``path``.
    ``added_token_form``: the BOS token as a serialised AddedToken (older snapshots) rather
    than a plain string (what ``transformers`` 5, and so vLLM, accepts)."""
    path.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus or _CORPUS, trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", bos)]
    )
    tok.save(str(path / "tokenizer.json"))
    config = {
        "bos_token": {"content": "<s>", "special": True} if added_token_form else "<s>",
        "eos_token": "</s>",
        "chat_template": template,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    (path / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return path
