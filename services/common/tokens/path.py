"""The one tokenization path: a :class:`Tokenizer` plus the engine kind's block hashing.

The gateway (HTTP and the gRPC Pick API), the engine simulator and the bench all turn text
into token ids and block hashes through a :class:`TokenPath`, built once in ``main``/``cli``
from settings (:func:`token_path`) and passed down:

- ``TokenPath()`` (the default): the simulator's whitespace tokenizer, its ``"role: content"``
  chat template and its own ``tideserve`` block hashes: what the engine simulator computes.
- ``token_path(model_dir, "vllm" | "sglang")``: the model's tokenizer and chat template and
  that engine's block hashes, which equal the hashes in that engine's KV events (as the
  kv-bridge republishes them), so precise prefix matching finds the engine's blocks.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from services.common.tokens.chat import ChatError, ChatMessage, chat_messages, chat_prompt
from services.common.tokens.engine_chat import engine_chat_inputs
from services.common.tokens.hashing import HashScheme, index_tenant, scheme_block_hashes
from services.common.tokens.model import load_model_tokenizer
from services.common.tokens.whitespace import count_tokens, tokenize

__all__ = ["TokenPath", "Tokenizer", "WhitespaceTokenizer", "part_separator", "token_path"]


@runtime_checkable
class Tokenizer(Protocol):
    """Text → token ids, the way one model does it."""

    @property
    def name(self) -> str: ...

    def encode(self, text: str) -> list[int]:
        """Token ids of a completion prompt."""
        ...

    def count(self, text: str) -> int: ...

    def encode_chat(
        self,
        messages: list[ChatMessage],
        part_sep: str = " ",
        tools: list[dict[str, Any]] | None = None,
        special_tokens: bool = False,
    ) -> list[int]:
        """Token ids of validated chat messages (and the request's ``tools``) after the chat
        template; ``part_sep`` joins text content parts for templates that take a string;
        ``special_tokens``: the tokenizer's own (a BOS) added on top of the template's.
        Raises ``ChatError``."""
        ...


class WhitespaceTokenizer:
    """The simulator's tokenizer (one id per whitespace-separated word) and chat template."""

    name = "whitespace"

    def encode(self, text: str) -> list[int]:
        return tokenize(text)

    def count(self, text: str) -> int:
        return count_tokens(text)

    def encode_chat(
        self,
        messages: list[ChatMessage],
        part_sep: str = " ",
        tools: list[dict[str, Any]] | None = None,
        special_tokens: bool = False,
    ) -> list[int]:
        # The separator is whitespace either way (and it has no special tokens): the ids do not depend on it. The
        # simulator's template does not render tools.
        return tokenize(chat_prompt(messages))


def _is_unicode(text: str) -> bool:
    """Whether ``text`` is valid Unicode: JSON's ``"\\ud83d"`` escape decodes to a lone
    surrogate, which has no UTF-8 form."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _lone_surrogate(param: str) -> ChatError:
    return ChatError(
        "the text holds a lone UTF-16 surrogate (an unpaired \\ud800-\\udfff escape), "
        "which is not Unicode and cannot be tokenized",
        param,
        "invalid_unicode",
    )


def part_separator(scheme: HashScheme) -> str:
    """How engine kind ``scheme`` joins text content parts for a string-content template."""
    return "\n" if scheme == "vllm" else " "


@dataclass(frozen=True, slots=True)
class TokenPath:
    """A tokenizer and the block-hash scheme of the engines behind it."""

    tokenizer: Tokenizer = field(default_factory=WhitespaceTokenizer)
    scheme: HashScheme = "tideserve"

    def encode(self, text: str, param: str = "prompt") -> list[int]:
        """Token ids of ``text``. Raises ``ChatError`` (``param``) if it holds a lone
        surrogate, which no tokenizer can encode."""
        try:
            return self.tokenizer.encode(text)
        except (UnicodeEncodeError, TypeError):
            if _is_unicode(text):
                raise
            raise _lone_surrogate(param) from None

    def encode_chat(
        self, messages: Any, tools: Any = None, *, special_tokens: bool = False
    ) -> list[int]:
        """Token ids of raw OpenAI ``messages`` and ``tools`` as the engine kind renders them
        (:mod:`~services.common.tokens.engine_chat`); ``special_tokens``: the tokenizer's
        own added too, as an engine's API does that tokenizes so
        (:func:`~services.common.tokens.engine_chat.adds_special_tokens`). Raises
        ``ChatError`` (→ HTTP 400)."""
        msgs, tool_list = engine_chat_inputs(self.scheme, chat_messages(messages), tools)
        sep = part_separator(self.scheme)
        try:
            return self.tokenizer.encode_chat(msgs, sep, tool_list, special_tokens)
        except (UnicodeEncodeError, TypeError):
            if _is_unicode(json.dumps([msgs, tool_list], ensure_ascii=False, default=str)):
                raise
            raise _lone_surrogate("messages") from None

    def block_hashes(
        self, token_ids: Sequence[int], block_size: int, *, tenant: str = ""
    ) -> list[int]:
        return scheme_block_hashes(self.scheme, token_ids, block_size, tenant=tenant)

    def index_tenant(self, cache_salt: str) -> str:
        """The tenant the KV index holds this salt's blocks under (see
        :func:`~services.common.tokens.hashing.index_tenant`)."""
        return index_tenant(self.scheme, cache_salt)


def token_path(model_dir: str | Path | None = None, scheme: HashScheme = "tideserve") -> TokenPath:
    """The path for ``model_dir`` (None = the whitespace tokenizer) and engine kind ``scheme``.
    The model's tokenizer is loaded once per directory. Raises ``ModelDirError``."""
    tok: Tokenizer = WhitespaceTokenizer() if model_dir is None else load_model_tokenizer(model_dir)
    return TokenPath(tok, scheme)
