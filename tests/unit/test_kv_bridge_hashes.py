"""Engine-side block hash re-implementations (what a router must compute for real engines)."""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Callable

import pytest

from services.common.tokens import block_hashes as tideserve_block_hashes
from services.common.tokens.hashing import (
    sglang_block_hashes,
    vllm_block_hashes,
    vllm_none_hash,
)
from services.kvbridge.wire import MASK64, decode_batch, fold_hash
from tests.unit._kv_bridge_helpers import vllm_payload, vllm_stored


def test_sglang_first_page_vector() -> None:
    # sha256 over token ids 1, 2 as 4-byte little-endian; id = first 8 bytes
    digest = hashlib.sha256(b"\x01\x00\x00\x00\x02\x00\x00\x00").digest()
    assert sglang_block_hashes([1, 2], 2) == [int.from_bytes(digest[:8], "big")]


def test_sglang_chain_vector() -> None:
    d0 = hashlib.sha256(b"\x01\x00\x00\x00").digest()
    d1 = hashlib.sha256(d0 + b"\x05\x00\x00\x00").digest()
    assert sglang_block_hashes([1, 5, 9], 1)[:2] == [
        int.from_bytes(d0[:8], "big"),
        int.from_bytes(d1[:8], "big"),
    ]


def test_sglang_signed_event_id_folds_to_same_value() -> None:
    (h,) = sglang_block_hashes(list(range(4)), 4)
    signed = h - 2**64 if h >= 2**63 else h  # what SGLang puts on the wire
    assert fold_hash(signed) == h


def test_vllm_first_block_vector() -> None:
    none = hashlib.sha256(pickle.dumps("vllm-none-hash", protocol=5)).digest()
    assert vllm_none_hash() == none
    h0 = hashlib.sha256(pickle.dumps((none, (7, 8), None), protocol=5)).digest()
    assert vllm_block_hashes([7, 8, 9], 2) == [int.from_bytes(h0, "big") & MASK64]


def test_vllm_bytes_and_int_events_fold_to_router_ids() -> None:
    tokens = list(range(32))
    ids = vllm_block_hashes(tokens, 16)
    none = vllm_none_hash()
    h0 = hashlib.sha256(pickle.dumps((none, tuple(tokens[:16]), None), protocol=5)).digest()
    as_bytes = decode_batch(vllm_payload([vllm_stored([h0], block_size=16)])).events[0]
    as_int = decode_batch(
        vllm_payload([vllm_stored([int.from_bytes(h0, "big") & MASK64], block_size=16)])
    ).events[0]
    assert as_bytes.block_hashes == as_int.block_hashes == (ids[0],)  # type: ignore[union-attr]


@pytest.mark.parametrize("f", [vllm_block_hashes, sglang_block_hashes], ids=["vllm", "sglang"])
def test_chained_prefix_stable_and_full_blocks_only(
    f: Callable[[list[int], int], list[int]],
) -> None:
    long = f(list(range(40)), 8)
    assert len(long) == 5
    assert f(list(range(23)), 8) == long[:2]
    # same block content at another position hashes differently (chained)
    assert f([1] * 16, 8)[0] != f([1] * 16, 8)[1]
    with pytest.raises(ValueError):
        f([1], 0)


def test_vllm_seed_changes_every_hash() -> None:
    a = vllm_block_hashes(list(range(16)), 8)
    b = vllm_block_hashes(list(range(16)), 8, seed="0")
    assert not set(a) & set(b)


def test_engine_hashes_are_not_tideserve_hashes() -> None:
    tokens = list(range(32))
    ours = tideserve_block_hashes(tokens, 16)
    assert not set(ours) & set(vllm_block_hashes(tokens, 16))
    assert not set(ours) & set(sglang_block_hashes(tokens, 16))
