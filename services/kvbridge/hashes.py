"""Block hashes as real engines compute them, folded like the bridge folds them (pure).

The bridge republishes the ENGINE's block hashes. ``MatchPrefix`` only finds those blocks when
the router queries with the same hashes, i.e. computed from the engine's token ids (the
model's tokenizer and chat template, not ``services.common.tokens.tokenize``) with the
engine's hash function, then folded to u64 by :func:`services.kvbridge.wire.fold_hash`.
These functions are re-implementations of the algorithms as documented in the engines'
sources (see README.md); they were checked against hand-computed vectors, not against a
running engine, and they cover the plain case only (no LoRA, multimodal inputs, cache salt or
prompt embeddings, which the engines mix into the hash as "extra keys").

- vLLM (``--prefix-caching-hash-algo sha256``, the default): ``h_i = sha256(pickle((h_{i-1},
  tuple(block_tokens), extra_keys)))`` with ``h_{-1} = NONE_HASH = sha256(pickle(seed))``;
  ``seed`` = ``PYTHONHASHSEED`` if set, else ``"vllm-none-hash"`` in recent versions (older
  versions drew ``os.urandom(32)`` per process: their hashes cannot be reproduced outside
  the engine). Only full blocks are hashed. Event ids: the low 64 bits of ``h_i``
  (``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1``, the default) or ``h_i`` itself (folded alike).
- SGLang (sha256 page hashes, versions publishing ``hash_str_to_int64``): ``d_i =
  sha256(d_{i-1} || token ids as 4-byte little-endian)`` (``d_{-1}`` absent), one per page;
  event id = the first 8 bytes of ``d_i`` as a signed int64 (folded: as unsigned). Older
  SGLang published Python ``hash(tuple(page_tokens))``: the page alone, not chained, and
  tied to the CPython version's tuple hash.
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Sequence

from services.kvbridge.wire import MASK64

__all__ = ["VLLM_DEFAULT_SEED", "sglang_block_hashes", "vllm_block_hashes", "vllm_none_hash"]

VLLM_DEFAULT_SEED = "vllm-none-hash"


def _sha256_pickle(obj: object) -> bytes:
    return hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def vllm_none_hash(seed: str = VLLM_DEFAULT_SEED) -> bytes:
    """vLLM's chain seed ``NONE_HASH`` for the sha256 algorithm."""
    return _sha256_pickle(seed)


def vllm_block_hashes(
    token_ids: Sequence[int], block_size: int, *, seed: str = VLLM_DEFAULT_SEED
) -> list[int]:
    """Folded u64 ids of the full blocks of ``token_ids`` as vLLM (sha256) publishes them."""
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    parent = vllm_none_hash(seed)
    out: list[int] = []
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = _sha256_pickle((parent, tuple(token_ids[start : start + block_size]), None))
        out.append(int.from_bytes(parent, "big") & MASK64)
    return out


def sglang_block_hashes(token_ids: Sequence[int], page_size: int) -> list[int]:
    """Folded u64 ids of the full pages of ``token_ids`` as SGLang (sha256) publishes them."""
    if page_size <= 0:
        raise ValueError(f"page_size must be positive, got {page_size}")
    prior = b""
    out: list[int] = []
    for start in range(0, len(token_ids) - page_size + 1, page_size):
        h = hashlib.sha256(prior)
        for t in token_ids[start : start + page_size]:
            h.update(int(t).to_bytes(4, "little", signed=False))
        prior = h.digest()
        out.append(int.from_bytes(prior[:8], "big"))
    return out
