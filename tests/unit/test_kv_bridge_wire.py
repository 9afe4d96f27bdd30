"""Decoding vLLM / SGLang KV-event messages built in their exact wire formats."""

from __future__ import annotations

import hashlib
from typing import Any

import msgpack
import pytest

from services.kvbridge.wire import (
    END_SEQ,
    MASK64,
    AllCleared,
    BlockRemoved,
    BlockStored,
    Engine,
    EngineBatch,
    UnknownEvent,
    WireError,
    decode_batch,
    decode_live,
    decode_replay,
    encode_replay_request,
    fold_hash,
)
from tests.unit._kv_bridge_helpers import (
    SGLANG_BATCH,
    SGLANG_REMOVED,
    SGLANG_STORED,
    VLLM_V09_REMOVED,
    VLLM_V09_STORED,
    as_array,
    as_map,
    frames,
    pack,
    vllm_cleared,
    vllm_payload,
    vllm_removed,
    vllm_stored,
)

DIGEST = hashlib.sha256(b"block-0").digest()
DIGEST_U64 = int.from_bytes(DIGEST, "big") & MASK64


def test_hand_assembled_bytes_decode() -> None:
    """A vLLM batch written out byte by byte: [1.5, [["AllBlocksCleared"]]]."""
    payload = (
        b"\x92"  # array of 2: [ts, events]
        + b"\xcb\x3f\xf8\x00\x00\x00\x00\x00\x00"  # float64 1.5
        + b"\x91"  # events: array of 1
        + b"\x91"  # event: tagged array of 1
        + b"\xb0AllBlocksCleared"  # fixstr of 16
    )
    assert decode_batch(payload) == EngineBatch(1.5, (AllCleared(),), None)
    # and a BlockStored with a uint64 hash, nil parent, 2 tokens, block size 2, nil lora:
    stored = (
        b"\x92\xcb\x3f\xf8\x00\x00\x00\x00\x00\x00\x91"
        + b"\x96\xabBlockStored"  # tagged array of 6
        + b"\x91\xcf\xff\xff\xff\xff\xff\xff\xff\xfe"  # [2**64 - 2]
        + b"\xc0"  # parent nil
        + b"\x92\x01\x02"  # token ids [1, 2]
        + b"\x02"  # block size 2
        + b"\xc0"  # lora_id nil
    )
    ev = decode_batch(stored).events[0]
    assert ev == BlockStored((2**64 - 2,), None, 2, 2, "", None, None)


STORED_CASES: list[tuple[Engine, Any, BlockStored]] = [
    (
        Engine.VLLM,
        as_array(
            "BlockStored",
            VLLM_V09_STORED,
            block_hashes=[11, 12],
            parent_block_hash=10,
            token_ids=list(range(32)),
            block_size=16,
            lora_id=None,
        ),
        BlockStored((11, 12), 10, 32, 16, "", None, None),
    ),
    (
        Engine.VLLM,
        vllm_stored([21, 22, 23], parent=None, block_size=4, medium="GPU", lora_name="sql"),
        BlockStored((21, 22, 23), None, 12, 4, "sql", "GPU", None),
    ),
    (
        Engine.VLLM,
        vllm_stored([DIGEST], parent=DIGEST, block_size=8, lora_id=3),
        BlockStored((DIGEST_U64,), DIGEST_U64, 8, 8, "3", "GPU", None),
    ),
    (
        Engine.VLLM,
        vllm_stored([2**64 - 1], block_size=16, medium="CPU", group_idx=1),
        BlockStored((2**64 - 1,), None, 16, 16, "", "CPU", 1),
    ),
    (
        Engine.VLLM,
        vllm_stored([5, 6], parent=4, block_size=16, group_idx=0, as_map_encoding=True),
        BlockStored((5, 6), 4, 32, 16, "", "GPU", 0),
    ),
    (
        Engine.VLLM,
        vllm_stored([7], tokens=[], block_size=16),
        BlockStored((7,), None, 16, 16, "", "GPU", None),
    ),
    (
        Engine.SGLANG,
        as_array(
            "BlockStored",
            SGLANG_STORED,
            block_hashes=[-5],
            parent_block_hash=-9,
            token_ids=[1, 2, 3],
            block_size=3,
            lora_id=None,
        ),
        BlockStored(((-5) & MASK64,), (-9) & MASK64, 3, 3, "", None, None),
    ),
    (
        Engine.SGLANG,
        as_array(
            "BlockStored",
            SGLANG_STORED,
            block_hashes=[1],
            parent_block_hash=None,
            token_ids=[[1, 2], [2, 3]],  # bigram pages: tuples of token ids
            block_size=2,
            lora_id=None,
            medium="CPU_PINNED",
        ),
        BlockStored((1,), None, 2, 2, "", "CPU_PINNED", None),
    ),
    (
        Engine.SGLANG,  # a later SGLang field at index 7 (a metadata map) is ignored
        [
            *as_array(
                "BlockStored",
                SGLANG_STORED,
                block_hashes=[1],
                parent_block_hash=None,
                token_ids=[1],
                block_size=1,
                lora_id=None,
                medium="GPU",
            ),
            {"cache_salt": "tenant-a"},
        ],
        BlockStored((1,), None, 1, 1, "", "GPU", None),
    ),
]


@pytest.mark.parametrize(
    ("engine", "event", "expected"),
    STORED_CASES,
    ids=[
        "vllm-0.9-array",
        "vllm-array-medium-lora-name",
        "vllm-bytes-sha256-digests",
        "vllm-uint64-max-cpu-group1",
        "vllm-map-encoded",
        "vllm-no-token-ids",
        "sglang-negative-python-hash",
        "sglang-bigram-cpu-pinned",
        "sglang-trailing-metadata",
    ],
)
def test_block_stored(engine: Engine, event: Any, expected: BlockStored) -> None:
    batch_schema = SGLANG_BATCH if engine is Engine.SGLANG else None
    payload = (
        pack(as_array(None, batch_schema, ts=2.0, events=[event]))
        if batch_schema
        else vllm_payload([event], ts=2.0)
    )
    batch = decode_batch(payload, engine)
    assert batch.ts == 2.0
    assert batch.events == (expected,)


OTHER_CASES: list[tuple[Engine, Any, object]] = [
    (Engine.VLLM, vllm_removed([1, 2]), BlockRemoved((1, 2), "GPU", None)),
    (Engine.VLLM, vllm_removed([DIGEST], medium="CPU"), BlockRemoved((DIGEST_U64,), "CPU", None)),
    (Engine.VLLM, vllm_removed([3], as_map_encoding=True), BlockRemoved((3,), "GPU", None)),
    (
        Engine.VLLM,
        as_array("BlockRemoved", VLLM_V09_REMOVED, block_hashes=[4]),
        BlockRemoved((4,), None, None),
    ),
    (
        Engine.SGLANG,
        as_array("BlockRemoved", SGLANG_REMOVED, block_hashes=[-1]),
        BlockRemoved((MASK64,), None, None),
    ),
    (Engine.VLLM, vllm_cleared(), AllCleared()),
    (Engine.VLLM, vllm_cleared(as_map_encoding=True), AllCleared()),
    (Engine.VLLM, ["BlockPinned", [1]], UnknownEvent("BlockPinned")),
    (Engine.VLLM, {"type": "Future", "x": 1}, UnknownEvent("Future")),
]


@pytest.mark.parametrize(
    ("engine", "event", "expected"),
    OTHER_CASES,
    ids=[
        "vllm-removed",
        "vllm-removed-bytes-cpu",
        "vllm-removed-map",
        "vllm-0.9-removed",
        "sglang-removed",
        "vllm-cleared",
        "vllm-cleared-map",
        "unknown-tag-array",
        "unknown-tag-map",
    ],
)
def test_other_events(engine: Engine, event: Any, expected: object) -> None:
    assert decode_batch(vllm_payload([event]), engine).events == (expected,)


@pytest.mark.parametrize(
    ("payload", "ts", "rank"),
    [
        (vllm_payload([], ts=3.25), 3.25, None),
        (vllm_payload([], ts=3.25, rank=2), 3.25, 2),
        (pack(as_map(None, [("ts", None), ("events", None)], ts=7, events=[])), 7.0, None),
        (pack({"ts": 1.0, "events": [], "data_parallel_rank": 1}), 1.0, 1),
        (pack([1.0, [], 3]), 1.0, 3),
    ],
    ids=["array", "array-dp-rank", "map-int-ts", "map-dp-rank", "sglang-attn-dp-rank"],
)
def test_batch_envelope(payload: bytes, ts: float, rank: int | None) -> None:
    batch = decode_batch(payload)
    assert (batch.ts, batch.dp_rank, batch.events) == (ts, rank, ())


MALFORMED: list[tuple[bytes, str]] = [
    (b"\xc1", "not msgpack"),
    (b"", "not msgpack"),
    (pack(7), "expected array or map"),
    (pack([1.0]), "expected [ts, events"),
    (pack({"events": []}), "lacks 'ts'"),
    (pack(["x", []]), "expected a finite number"),
    (pack([float("nan"), []]), "expected a finite number"),
    (pack([1.0, {"a": 1}]), "events is a dict"),
    (pack([1.0, [7]]), "event 0: event is a int"),
    (pack([1.0, [[]]]), "without a string tag"),
    (pack([1.0, [[3, [1]]]]), "without a string tag"),
    (pack([1.0, [{"block_hashes": [1]}]]), "without a string 'type'"),
    (pack([1.0, [["BlockStored", [1], None]]]), "BlockStored lacks token_ids"),
    (pack([1.0, [["BlockStored", [1], None, [1], -1, None]]]), "block_size is -1"),
    (pack([1.0, [["BlockStored", ["ab"], None, [1], 1, None]]]), "block hash has type str"),
    (pack([1.0, [["BlockStored", [b""], None, [1], 1, None]]]), "empty bytes"),
    (pack([1.0, [["BlockStored", [True], None, [1], 1, None]]]), "block hash is a bool"),
    (pack([1.0, [["BlockStored", 5, None, [1], 1, None]]]), "block_hashes is a int"),
    (pack([1.0, [["BlockStored", [1], None, 5, 1, None]]]), "token_ids is a int"),
    (pack([1.0, [["BlockRemoved", [1], 5]]]), "medium is 5"),
    (pack([1.0, [["BlockRemoved"]]]), "BlockRemoved lacks block_hashes"),
    (pack([1.0, [], "zero"]), "dp rank is 'zero'"),
    (pack([1.0, [vllm_cleared(), ["BlockRemoved", "x"]]]), "event 1:"),
]


@pytest.mark.parametrize(
    ("payload", "message"),
    MALFORMED,
    ids=[
        "reserved-byte",
        "empty",
        "scalar",
        "short-array",
        "map-no-ts",
        "ts-string",
        "ts-nan",
        "events-map",
        "event-int",
        "event-empty-array",
        "tag-int",
        "map-no-type",
        "stored-missing-tokens",
        "stored-negative-block-size",
        "hash-string",
        "hash-empty-bytes",
        "hash-bool",
        "hashes-not-array",
        "tokens-not-array",
        "medium-int",
        "removed-no-hashes",
        "rank-string",
        "second-event-bad",
    ],
)
def test_malformed_payload_raises(payload: bytes, message: str) -> None:
    with pytest.raises(WireError, match=message.replace("[", r"\[").replace("(", r"\(")):
        decode_batch(payload)


def test_truncated_payload_raises() -> None:
    good = vllm_payload([vllm_stored([1, 2])])
    with pytest.raises(WireError, match="not msgpack"):
        decode_batch(good[:-3])


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0, 0),
        (2**64 - 1, 2**64 - 1),
        (2**64 + 5, 5),
        (-1, MASK64),
        (-(2**63), 2**63),
        (b"\x01", 1),
        (b"\xff" * 8, MASK64),
        (DIGEST, DIGEST_U64),
        (b"\x00" * 24 + (42).to_bytes(8, "big"), 42),
    ],
    ids=[
        "zero",
        "u64-max",
        "wider-int-masked",
        "i64-minus-one",
        "i64-min",
        "one-byte",
        "eight-ff",
        "sha256-low-64-bits",
        "digest-tail",
    ],
)
def test_fold_hash(value: object, expected: int) -> None:
    assert fold_hash(value) == expected


@pytest.mark.parametrize(
    ("parts", "message"),
    [
        ([b"", b"\x00" * 8], "got 2"),
        ([b"", b"\x00" * 7, b"p"], "7 bytes"),
        ([b"", b"\x00" * 8, b"p", b"x"], "got 4"),
    ],
    ids=["two-frames", "short-seq", "four-frames"],
)
def test_live_frames_malformed(parts: list[bytes], message: str) -> None:
    with pytest.raises(WireError, match=message):
        decode_live(parts)


def test_live_frames() -> None:
    msg = decode_live(frames(2**40 + 3, b"payload", topic=b"kv-events"))
    assert (msg.topic, msg.seq, msg.payload) == (b"kv-events", 2**40 + 3, b"payload")


@pytest.mark.parametrize(
    ("parts", "expected"),
    [
        ([b"", (5).to_bytes(8, "big"), b"p"], (5, b"p")),
        ([(5).to_bytes(8, "big"), b"p"], (5, b"p")),
        ([b"", (-1).to_bytes(8, "big", signed=True), b""], (END_SEQ, b"")),
        # vLLM 0.32 (captured from its replay socket): the PUB message behind the delimiter
        ([b"", b"kv", (5).to_bytes(8, "big"), b"p"], (5, b"p")),
        ([b"", b"", (5).to_bytes(8, "big"), b"p"], (5, b"p")),
        ([b"", b"", (-1).to_bytes(8, "big", signed=True), b""], (END_SEQ, b"")),
        ([b"kv", (5).to_bytes(8, "big"), b"p"], (5, b"p")),
    ],
    ids=[
        "dealer",
        "req-style",
        "end-marker",
        "topic-dealer",
        "empty-topic-dealer",
        "topic-end-marker",
        "topic-req-style",
    ],
)
def test_replay_frames(parts: list[bytes], expected: tuple[int, bytes]) -> None:
    assert decode_replay(parts) == expected


def test_replay_frames_malformed() -> None:
    with pytest.raises(WireError):
        decode_replay([b"", b"\x00", b"p"])
    with pytest.raises(WireError):
        decode_replay([b"only"])
    with pytest.raises(WireError):
        decode_replay([b"x", b"kv", (5).to_bytes(8, "big"), b"p"])
    with pytest.raises(WireError, match="got 5"):
        decode_replay([b"", b"kv", (5).to_bytes(8, "big"), b"p", b"q"])


def test_replay_request_frames() -> None:
    assert encode_replay_request(258) == [b"", b"\x00" * 6 + b"\x01\x02"]
    with pytest.raises(ValueError):
        encode_replay_request(-1)


def test_sglang_0523_map_encoded_batch() -> None:
    """The shape a running SGLang 0.5.23 (CPU, page size 1) published, seen on its ZMQ socket:
    map-encoded events, signed int64 page hashes, ``medium`` "GPU", the dp rank last."""
    payload = msgpack.packb(
        [
            1796281784.13,
            [
                {
                    "type": "BlockStored",
                    "block_hashes": [-2360060374177730597, 5],
                    "parent_block_hash": None,
                    "token_ids": [0, 56],
                    "block_size": 1,
                    "lora_id": None,
                    "medium": "GPU",
                }
            ],
            0,
        ]
    )
    batch = decode_batch(payload, Engine.SGLANG)
    (event,) = batch.events
    assert isinstance(event, BlockStored)
    assert event.block_hashes == ((-2360060374177730597) & MASK64, 5)
    assert (event.parent_hash, event.block_size, event.medium, batch.dp_rank) == (
        None,
        1,
        "GPU",
        0,
    )
