"""The shared tokenizer and block hashes are deterministic and chained."""

from __future__ import annotations

import re
import subprocess
import sys
import zlib
from array import array

import pytest

from services.common import tokens


def test_tokenize_is_one_id_per_word_and_stable_across_processes() -> None:
    text = "hello  world\nhello"
    ids = tokens.tokenize(text)
    assert len(ids) == 3 and ids[0] == ids[2] != ids[1]
    code = "from services.common import tokens; print(tokens.tokenize('hello  world\\nhello'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(ids)


def _by_definition(text: str) -> list[int]:
    """The module doc's rule, written the slow way: ``\\S+`` words, crc32 of their UTF-8."""
    span = tokens.VOCAB_SIZE - tokens.FIRST_WORD_ID
    return [
        zlib.crc32(w.encode("utf-8")) % span + tokens.FIRST_WORD_ID
        for w in re.findall(r"\S+", text)
    ]


@pytest.mark.parametrize(
    "text",
    [
        "plain ascii words  with\ttabs\nand\r\nnewlines ",
        "ascii\x1cinformation\x1dseparators\x1eare\x1fwhitespace",
        "\x0bvertical\x0cform feed",
        "unicode caf\u00e9 na\u00efve \u65e5\u672c\u8a9e",
        "no-break\u00a0space ideographic\u3000space line\u2028separator",
        "",
        "   ",
    ],
    ids=[
        "ascii",
        "ascii-separators",
        "vt-ff",
        "utf8-words",
        "unicode-whitespace",
        "empty",
        "blank",
    ],
)
def test_tokenize_equals_the_definition(text: str) -> None:
    assert tokens.tokenize(text) == _by_definition(text)
    assert tokens.count_tokens(text) == len(_by_definition(text))


@pytest.mark.parametrize(
    ("a", "b", "shared"),
    [
        ([1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 9, 9], 2),
        ([1, 2, 3, 4], [9, 2, 3, 4], 0),
        ([1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 6, 7], 3),
    ],
    ids=["diverge-in-block-3", "diverge-at-start", "extension"],
)
def test_block_hashes_share_exactly_the_common_prefix(
    a: list[int], b: list[int], shared: int
) -> None:
    ha, hb = tokens.block_hashes(a, 2), tokens.block_hashes(b, 2)
    common = 0
    while common < min(len(ha), len(hb)) and ha[common] == hb[common]:
        common += 1
    assert common == shared


def test_block_hash_covers_the_whole_prefix() -> None:
    # Same second block, different first block: the second hashes differ too.
    assert tokens.block_hashes([1, 1, 7, 7], 2)[1] != tokens.block_hashes([2, 2, 7, 7], 2)[1]


def test_partial_block_is_not_hashed_and_tenants_do_not_share() -> None:
    assert len(tokens.block_hashes(list(range(10)), 4)) == 2
    ids = list(range(8))
    assert set(tokens.block_hashes(ids, 4, tenant="a")).isdisjoint(tokens.block_hashes(ids, 4))


def test_parent_continues_a_chain() -> None:
    ids = list(range(12))
    whole = tokens.block_hashes(ids, 4)
    assert tokens.block_hashes(ids[4:], 4, parent=whole[0]) == whole[1:]


def test_bad_block_size_is_refused() -> None:
    with pytest.raises(ValueError, match="block_size"):
        tokens.block_hashes([1], 0)
    with pytest.raises(ValueError, match="block_size"):
        tokens.payload_block_hashes(b"", 0)


def _chained_one_by_one(ids: list[int], block_size: int, parent: int) -> list[int]:
    """The definition (module docstring): blake2b-64 of parent || the block's uint32 ids."""
    from array import array
    from hashlib import blake2b

    out, h = [], parent
    for start in range(0, len(ids) - len(ids) % block_size, block_size):
        payload = h.to_bytes(8, "little") + array("I", ids[start : start + block_size]).tobytes()
        h = int.from_bytes(blake2b(payload, digest_size=8).digest(), "little") or 1
        out.append(h)
    return out


@pytest.mark.parametrize(
    ("n", "block_size", "parent"),
    [
        pytest.param(0, 4, 0, id="empty"),
        pytest.param(3, 4, 0, id="partial-only"),
        pytest.param(64, 16, 0, id="whole-blocks"),
        pytest.param(1000, 64, 0, id="trailing-partial"),
        pytest.param(130, 64, 12345, id="continued-chain"),
    ],
)
def test_block_hashes_equal_the_definition(n: int, block_size: int, parent: int) -> None:
    ids = [(i * 7_919) % tokens.VOCAB_SIZE for i in range(n)]
    want = _chained_one_by_one(ids, block_size, parent)
    assert tokens.block_hashes(ids, block_size, parent=parent) == want
    assert tokens.block_hashes(tuple(ids), block_size, parent=parent) == want
    payload = array("I", ids).tobytes()
    assert tokens.payload_block_hashes(payload, block_size, parent=parent) == want
    assert len(payload) == n * tokens.TOKEN_BYTES


def test_a_zero_digest_chains_as_hash_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """A block whose digest is zero has hash 1, and its child is chained from 1: the digests
    chained as they are would give another child (the definition, with such a digest)."""
    from hashlib import blake2b as real

    ids = list(range(40))
    zero_after = (7).to_bytes(8, "little")  # the digest of the block after parent 7 is 0

    class _Fake:
        def __init__(self, data: bytes, digest_size: int) -> None:
            self._zero = bytes(data[:8]) == zero_after
            self._h = real(data, digest_size=digest_size)

        def digest(self) -> bytes:
            return bytes(8) if self._zero else self._h.digest()

    import services.common.tokens.whitespace as ws

    monkeypatch.setattr(ws, "blake2b", _Fake)
    got = tokens.payload_block_hashes(array("I", ids).tobytes(), 4, parent=7)
    assert got[0] == 1
    want = [1]
    for start in range(4, 40, 4):
        payload = want[-1].to_bytes(8, "little") + array("I", ids[start : start + 4]).tobytes()
        want.append(int.from_bytes(real(payload, digest_size=8).digest(), "little") or 1)
    assert got == want
