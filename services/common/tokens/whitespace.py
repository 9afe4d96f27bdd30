"""The simulator's deterministic tokenizer and its chained KV block hashes (the defaults).

The engine simulator, the benchmark's prompt synthesis, the scheduler's prefix scorers and
kvmeta must agree on how text becomes tokens and tokens become block hashes, across
processes and runs. Python's ``hash()`` is salted per process, so nothing here uses it.

Tokenizer: a token is a maximal run of non-whitespace characters (``\\S+``); its id is
``crc32(utf-8 bytes) % (VOCAB_SIZE - FIRST_WORD_ID) + FIRST_WORD_ID``. Ids below
``FIRST_WORD_ID`` are reserved for special tokens. ``detokenize`` is not an inverse (ids are
hashed); the simulator renders generated ids as ``t<id>`` words, which tokenize back to ids.

Block hashes: tokens are cut into full blocks of ``block_size`` (a trailing partial block is
not hashed: engines only cache full pages). The hash of block ``i`` is
``blake2b(parent_hash || tokens of block i)`` truncated to 64 bits, where ``parent_hash`` is
the hash of block ``i-1`` and, for block 0, the tenant seed (0 for the default tenant). So a
block's hash covers its whole prefix, and two tenants never share a hash.
"""

from __future__ import annotations

import re
import sys
import zlib
from array import array
from collections.abc import Sequence
from hashlib import blake2b

VOCAB_SIZE = 128_000
FIRST_WORD_ID = 256
BOS_ID = 1
EOS_ID = 2

_SPAN = VOCAB_SIZE - FIRST_WORD_ID
_ITEM = array("I").itemsize  # bytes per token id in a block's hashed payload
TOKEN_BYTES = _ITEM
# ASCII characters ``str.isspace()`` counts as whitespace and ``bytes.split()`` does not.
_ASCII_SEPARATORS = re.compile(rb"[\x1c-\x1f]")


def token_id(word: str) -> int:
    """Id of one whitespace-free word."""
    return zlib.crc32(word.encode("utf-8")) % _SPAN + FIRST_WORD_ID


def _words(text: str) -> list[bytes]:
    """The UTF-8 bytes of each whitespace-separated word (``str.isspace()`` whitespace, as
    the regex ``\\S+`` splits). ASCII text (the common case) is encoded once and split as
    bytes: no per-word encode."""
    if text.isascii():
        data = text.encode("ascii")
        if _ASCII_SEPARATORS.search(data) is None:
            return data.split()
    return [w.encode("utf-8") for w in text.split()]


def tokenize(text: str) -> list[int]:
    """Token ids of ``text``: one per whitespace-separated word."""
    return [c % _SPAN + FIRST_WORD_ID for c in map(zlib.crc32, _words(text))]


def count_tokens(text: str) -> int:
    return len(text.split())


def render_token(tid: int) -> str:
    """Text of a generated token id (a word that does not tokenize to ``tid``; see module doc)."""
    return f"t{tid}"


def tenant_seed(tenant: str) -> int:
    """Parent hash of block 0 for a tenant; 0 for the default tenant ("")."""
    if not tenant:
        return 0
    return _h64(b"tenant\x00" + tenant.encode("utf-8"))


def block_hashes(
    token_ids: Sequence[int], block_size: int, *, tenant: str = "", parent: int | None = None
) -> list[int]:
    """Chained 64-bit hashes of the full blocks of ``token_ids``.

    ``parent`` continues a chain (the hash of the block before ``token_ids[0]``); by default
    the chain starts at the tenant seed.
    """
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    full = len(token_ids) - len(token_ids) % block_size
    if not full:
        return []
    # The full blocks' bytes at once (one conversion, not one per block).
    payload = array("I", token_ids[:full]).tobytes()
    return payload_block_hashes(payload, block_size, tenant=tenant, parent=parent)


def payload_block_hashes(
    payload: bytes, block_size: int, *, tenant: str = "", parent: int | None = None
) -> list[int]:
    """:func:`block_hashes` of the token ids ``payload`` holds (``array("I", ids).tobytes()``,
    :data:`TOKEN_BYTES` per id), for callers that have the bytes already."""
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    h = tenant_seed(tenant) if parent is None else parent
    step = block_size * _ITEM
    end = len(payload) - len(payload) % step
    # Each block's payload is the parent hash (8 bytes, little-endian), then its ids. A
    # non-zero digest read little-endian is the hash, so its bytes are the next block's
    # parent as they are: the loop chains digests, and they become ints at once after it.
    # (A zero digest, whose hash is 1, takes the loop below from the start.)
    digest, view = h.to_bytes(8, "little"), memoryview(payload)
    digests: list[bytes] = []
    append = digests.append
    for start in range(0, end, step):
        digest = blake2b(digest + view[start : start + step], digest_size=8).digest()
        append(digest)
    if _ZERO_DIGEST not in digests:
        return _digest_ints(b"".join(digests))
    out: list[int] = []
    for start in range(0, end, step):
        data = h.to_bytes(8, "little") + payload[start : start + step]
        h = int.from_bytes(blake2b(data, digest_size=8).digest(), "little") or 1
        out.append(h)
    return out


_ZERO_DIGEST = bytes(8)


def _digest_ints(data: bytes) -> list[int]:
    """The little-endian 64-bit ints of ``data``'s 8-byte digests, in order."""
    ints = array("Q", data)
    if sys.byteorder == "big":
        ints.byteswap()
    return ints.tolist()


def _h64(data: bytes) -> int:
    # Never 0: 0 means "no parent" on the wire.
    return int.from_bytes(blake2b(data, digest_size=8).digest(), "little") or 1
