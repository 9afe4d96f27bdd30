"""Tokenization, chat templates and block hashes, shared by every component.

- :mod:`.whitespace`: the simulator's deterministic tokenizer and ``tideserve`` block hashes
  (the defaults; ``tokenize``, ``block_hashes``, ... are re-exported here).
- :mod:`.chat`: validation of OpenAI ``messages`` (text content parts only) and the
  simulator's chat template ``chat_prompt``.
- :mod:`.model`: a model directory's own tokenizer and chat template (``tokenizers``, Jinja).
- :mod:`.hashing`: block hashes by engine kind (``tideserve``, ``vllm``, ``sglang``).
- :mod:`.path`: :class:`TokenPath`, the one path the gateway, the gRPC Pick API, the engine
  simulator and the bench use (built once from settings, passed down).
"""

from services.common.tokens.chat import ChatError, ChatMessage, chat_messages, chat_prompt
from services.common.tokens.hashing import (
    DEFAULT_BLOCK_SIZE,
    HASH_SCHEMES,
    HashScheme,
    scheme_block_hashes,
    sglang_block_hashes,
    vllm_block_hashes,
)
from services.common.tokens.model import ModelDirError, ModelTokenizer, load_model_tokenizer
from services.common.tokens.path import (
    Tokenizer,
    TokenPath,
    WhitespaceTokenizer,
    part_separator,
    token_path,
)
from services.common.tokens.whitespace import (
    BOS_ID,
    EOS_ID,
    FIRST_WORD_ID,
    TOKEN_BYTES,
    VOCAB_SIZE,
    block_hashes,
    count_tokens,
    payload_block_hashes,
    render_token,
    tenant_seed,
    token_id,
    tokenize,
)

__all__ = [
    "BOS_ID",
    "DEFAULT_BLOCK_SIZE",
    "EOS_ID",
    "FIRST_WORD_ID",
    "HASH_SCHEMES",
    "TOKEN_BYTES",
    "VOCAB_SIZE",
    "ChatError",
    "ChatMessage",
    "HashScheme",
    "ModelDirError",
    "ModelTokenizer",
    "TokenPath",
    "Tokenizer",
    "WhitespaceTokenizer",
    "block_hashes",
    "chat_messages",
    "chat_prompt",
    "count_tokens",
    "load_model_tokenizer",
    "part_separator",
    "payload_block_hashes",
    "render_token",
    "scheme_block_hashes",
    "sglang_block_hashes",
    "tenant_seed",
    "token_id",
    "token_path",
    "tokenize",
    "vllm_block_hashes",
]
