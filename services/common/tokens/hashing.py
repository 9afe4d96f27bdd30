"""Block hashes by engine kind (pure): the simulator's own, vLLM's and SGLang's.

Precise prefix matching only finds an engine's blocks when the router queries with the hashes
that engine publishes in its KV events (the kv-bridge republishes them folded to u64, see
``services/kvbridge/README.md``): computed from the engine's token ids (the model's tokenizer
and chat template, :mod:`services.common.tokens.model`) with the engine's hash function.
:func:`scheme_block_hashes` picks the function by :data:`HashScheme`:

- ``tideserve`` (default; the engine simulator): ``blake2b`` chain seeded by the tenant, see
  :mod:`services.common.tokens.whitespace`.
- ``vllm`` (``--prefix-caching-hash-algo sha256``, the default): ``h_i = sha256(pickle((h_{i-1},
  tuple(block_tokens), extra_keys)))`` with ``h_{-1} = NONE_HASH = sha256(pickle(seed))``;
  ``seed`` = ``PYTHONHASHSEED`` if set, else ``"vllm-none-hash"`` in recent versions (older
  versions drew ``os.urandom(32)`` per process: their hashes cannot be reproduced outside
  the engine). ``extra_keys`` is ``None`` for plain text, ``(("cache_salt", salt),)`` (a
  tagged key, as vLLM 0.32 hashes it) on the first block of a salted request. The engine's
  ``BlockStored`` events publish the salt untagged (``extra_keys: [salt]``), so the events
  do not show the hashed form. Only full blocks are hashed. Event ids: the low 64 bits of
  ``h_i`` (``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1``, the default) or ``h_i`` itself (folded
  alike).
- ``sglang`` (sha256 page hashes, versions publishing ``hash_str_to_int64``): ``d_i =
  sha256(d_{i-1} || token ids as 4-byte little-endian)`` (``d_{-1}`` absent), one per page;
  event id = the first 8 bytes of ``d_i`` as a signed int64 (folded: as unsigned). The page
  hash carries no salt: the tenant does not change it. Older SGLang published Python
  ``hash(tuple(page_tokens))``: the page alone, not chained, and tied to the CPython
  version's tuple hash.

The engine functions are re-implementations of the algorithms as documented in the engines'
sources (see the kv-bridge README); they were checked against hand-computed vectors, not
against a running engine, and they cover the plain case only (no LoRA, multimodal inputs or
prompt embeddings, which the engines mix into the hash as further "extra keys").
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Sequence
from typing import Literal, get_args

from services.common.tokens.whitespace import block_hashes as tideserve_block_hashes

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "HASH_SCHEMES",
    "MASK64",
    "VLLM_DEFAULT_SEED",
    "HashScheme",
    "index_tenant",
    "scheme_block_hashes",
    "sglang_block_hashes",
    "vllm_block_hashes",
    "vllm_none_hash",
]

DEFAULT_BLOCK_SIZE = 64
"""Tokens per KV block wherever a block size is not configured: the engine simulator's
cache, the gateway's prefix hashing, request views and routing plugins (one default, so
that hashes computed on both sides of a request agree out of the box)."""

MASK64 = (1 << 64) - 1
VLLM_DEFAULT_SEED = "vllm-none-hash"

HashScheme = Literal["tideserve", "vllm", "sglang"]
"""Whose block hashes: the simulator's own, or a real engine kind's."""
HASH_SCHEMES: tuple[HashScheme, ...] = get_args(HashScheme)


def _sha256_pickle(obj: object) -> bytes:
    return hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def vllm_none_hash(seed: str = VLLM_DEFAULT_SEED) -> bytes:
    """vLLM's chain seed ``NONE_HASH`` for the sha256 algorithm."""
    return _sha256_pickle(seed)


def vllm_block_hashes(
    token_ids: Sequence[int],
    block_size: int,
    *,
    seed: str = VLLM_DEFAULT_SEED,
    cache_salt: str = "",
) -> list[int]:
    """Folded u64 ids of the full blocks of ``token_ids`` as vLLM (sha256) publishes them;
    ``cache_salt`` (the request's, "" = none) is the first block's tagged extra key."""
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    parent = vllm_none_hash(seed)
    out: list[int] = []
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        extra = (("cache_salt", cache_salt),) if start == 0 and cache_salt else None
        parent = _sha256_pickle((parent, tuple(token_ids[start : start + block_size]), extra))
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


def scheme_block_hashes(
    scheme: HashScheme, token_ids: Sequence[int], block_size: int, *, tenant: str = ""
) -> list[int]:
    """Block hashes of ``token_ids`` as engine kind ``scheme`` computes them. ``tenant`` is the
    request's prefix-cache namespace (``cache_salt``): the simulator seeds its chain with it,
    vLLM salts the first block with it, SGLang ignores it."""
    if scheme == "tideserve":
        return tideserve_block_hashes(token_ids, block_size, tenant=tenant)
    if scheme == "vllm":
        return vllm_block_hashes(token_ids, block_size, cache_salt=tenant)
    if scheme == "sglang":
        return sglang_block_hashes(token_ids, block_size)
    raise ValueError(f"unknown hash scheme {scheme!r} (known: {', '.join(HASH_SCHEMES)})")


def index_tenant(scheme: HashScheme, cache_salt: str) -> str:
    """The tenant under which the KV index holds the blocks of a request with ``cache_salt``:
    the tenant its engine's events are stamped with.

    - ``tideserve``: the simulator stamps its events with the request's salt, so the index is
      namespaced by it (the chain is seeded with it too).
    - ``vllm``: the salt is inside the first block's hash, so every later hash of the chain
      differs per salt already; the kv-bridge stamps ``""`` (an event's continuation blocks
      carry no salt, so it could not stamp more). Looking up under the salt would find nothing.
    - ``sglang``: pages carry no salt and the engine shares them across tenants; the index
      says what the engine holds, under ``""``.
    """
    return cache_salt if scheme == "tideserve" else ""
