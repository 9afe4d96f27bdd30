"""Decoder of the KV-event wire format of vLLM's and SGLang's ZMQ publishers (pure).

Both engines publish with a ``ZmqEventPublisher`` (vLLM ``vllm/distributed/kv_events.py``,
SGLang ``python/sglang/srt/disaggregation/kv_events.py``):

- PUB socket, one 3-frame multipart message per batch: ``[topic, seq, payload]``; ``topic`` is
  the configured topic (default empty), ``seq`` the batch number as 8 bytes big-endian
  (``itertools.count()``: starts at 0 when the engine starts), ``payload`` the msgspec msgpack
  encoding of a ``KVEventBatch``.
- Optional ROUTER replay socket: a client sends the start seq as 8 bytes big-endian (behind an
  empty delimiter frame); the engine answers one message per buffered batch with ``seq >=
  start`` (default buffer: the last 10,000 batches), then an end marker with seq ``-1`` (8
  bytes, signed). vLLM 0.32 sends ``[topic, seq, payload]`` (the PUB message),
  older publishers ``[seq, payload]``; see :func:`decode_replay`.

Payload shapes (msgspec structs, ``omit_defaults=True``; trailing fields with default values
are left out of positional arrays, so arrays have variable length):

- batch: positional ``[ts (float seconds), events, dp_rank?]`` (``array_like=True``); newer
  vLLM builds may encode it as a map ``{"ts", "events", "data_parallel_rank"}``.
- events: tagged union, tag = class name. Positional (vLLM before PR #42892, SGLang):
  ``["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium,
  ...]``, ``["BlockRemoved", block_hashes, medium?, ...]``, ``["AllBlocksCleared"]``. Map
  (vLLM after PR #42892): ``{"type": "BlockStored", "block_hashes": ..., ...}``. vLLM's extra
  positional fields are ``lora_name, extra_keys, group_idx, kv_cache_spec_kind,
  kv_cache_spec_sliding_window`` (BlockStored) and ``group_idx`` (BlockRemoved); SGLang's
  later positional fields differ between versions and are not read.
- block hashes: vLLM ``ExternalBlockHash = bytes | int`` (a sha256 digest by default, or its low
  64 bits as an unsigned int with ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``); SGLang: Python
  ``hash()`` values (signed 64-bit) or ``hash_str_to_int64`` of its sha256 page hashes.
  :func:`fold_hash` maps every form to an unsigned 64-bit int: ints are masked to 64 bits,
  bytes are read big-endian and masked (= vLLM's own int conversion, so an engine switched
  between bytes and int mode yields the same ids).

Nothing here does I/O. Every decode error raises :class:`WireError` with a one-line message.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import msgpack  # type: ignore[import-untyped]

__all__ = [
    "END_SEQ",
    "MASK64",
    "AllCleared",
    "BlockRemoved",
    "BlockStored",
    "Engine",
    "EngineBatch",
    "EngineEvent",
    "LiveMessage",
    "UnknownEvent",
    "WireError",
    "decode_batch",
    "decode_live",
    "decode_replay",
    "encode_replay_request",
    "fold_hash",
]

MASK64 = (1 << 64) - 1
END_SEQ = -1
_SEQ_LEN = 8
# Upper bound on a payload we try to decode (engines send far smaller batches).
MAX_PAYLOAD = 64 * 1024 * 1024


class WireError(ValueError):
    """A message that is not a valid engine KV-event message (one-line reason)."""


class Engine(StrEnum):
    """Which engine's dialect to read (they differ only in optional trailing fields)."""

    VLLM = "vllm"
    SGLANG = "sglang"


@dataclass(frozen=True, slots=True)
class BlockStored:
    """Blocks became resident. ``block_hashes`` are folded to u64, parent first."""

    block_hashes: tuple[int, ...]
    parent_hash: int | None
    token_count: int
    block_size: int
    lora: str
    medium: str | None
    group_idx: int | None


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    """Blocks left ``medium``."""

    block_hashes: tuple[int, ...]
    medium: str | None
    group_idx: int | None


@dataclass(frozen=True, slots=True)
class AllCleared:
    """Every block of the engine is gone."""


@dataclass(frozen=True, slots=True)
class UnknownEvent:
    """An event whose tag this decoder does not know (skipped, never an error)."""

    tag: str


EngineEvent = BlockStored | BlockRemoved | AllCleared | UnknownEvent


@dataclass(frozen=True, slots=True)
class EngineBatch:
    """One decoded engine batch."""

    ts: float
    events: tuple[EngineEvent, ...]
    dp_rank: int | None


@dataclass(frozen=True, slots=True)
class LiveMessage:
    """One PUB message: topic, engine sequence number and the raw payload."""

    topic: bytes
    seq: int
    payload: bytes


# --------------------------------------------------------------------------- frames


def decode_live(frames: Sequence[bytes]) -> LiveMessage:
    """Split a PUB multipart message ``[topic, seq, payload]``. Raises WireError."""
    if len(frames) != 3:
        raise WireError(f"expected 3 frames [topic, seq, payload], got {len(frames)}")
    topic, seq, payload = (bytes(f) for f in frames)
    if len(seq) != _SEQ_LEN:
        raise WireError(f"seq frame has {len(seq)} bytes, expected {_SEQ_LEN}")
    return LiveMessage(topic, int.from_bytes(seq, "big", signed=False), payload)


def encode_replay_request(start_seq: int) -> list[bytes]:
    """Frames a DEALER sends to the engine's ROUTER replay socket: ``[b"", start_seq]``."""
    if start_seq < 0:
        raise ValueError("start_seq must be >= 0")
    return [b"", start_seq.to_bytes(_SEQ_LEN, "big", signed=False)]


def decode_replay(frames: Sequence[bytes]) -> tuple[int, bytes]:
    """Split a replay answer as a DEALER receives it. Returns ``(seq, payload)``;
    ``seq == END_SEQ`` marks the end of the replay.

    Two layouts are in use, each with or without the leading empty delimiter (a REQ-style
    client gets the frames without it):

    - ``[b"", topic, seq, payload]``: vLLM 0.32 (the PUB message behind the
      delimiter; the end marker is ``[b"", b"", -1, b""]``);
    - ``[b"", seq, payload]``: older publishers (no topic).

    Three frames are ambiguous (delimiter + ``[seq, payload]``, or ``[topic, seq, payload]``
    without one): the 8-byte seq frame decides, the delimiter reading first.
    """
    parts = [bytes(f) for f in frames]
    if len(parts) == 4 and parts[0] == b"":
        parts = parts[2:]
    elif len(parts) == 3 and parts[0] == b"" and len(parts[1]) == _SEQ_LEN:
        parts = parts[1:]
    elif len(parts) == 3:
        parts = parts[1:]
    if len(parts) != 2:
        raise WireError(
            f"expected replay frames [topic, seq, payload] or [seq, payload], "
            f"got {len(frames)} frames"
        )
    seq, payload = parts
    if len(seq) != _SEQ_LEN:
        raise WireError(f"replay seq frame has {len(seq)} bytes, expected {_SEQ_LEN}")
    value = int.from_bytes(seq, "big", signed=True)
    if value == END_SEQ:
        return END_SEQ, b""
    return int.from_bytes(seq, "big", signed=False), payload


# --------------------------------------------------------------------------- payload


def fold_hash(value: object) -> int:
    """An engine block hash as an unsigned 64-bit int (see module doc). Raises WireError."""
    if isinstance(value, bool):
        raise WireError("block hash is a bool")
    if isinstance(value, int):
        return value & MASK64
    if isinstance(value, bytes | bytearray | memoryview):
        raw = bytes(value)
        if not raw:
            raise WireError("block hash is empty bytes")
        return int.from_bytes(raw, "big") & MASK64
    raise WireError(f"block hash has type {type(value).__name__}, expected int or bytes")


def decode_batch(payload: bytes, engine: Engine = Engine.VLLM) -> EngineBatch:
    """Decode one msgpack payload into an :class:`EngineBatch`. Raises WireError.

    Unknown event tags become :class:`UnknownEvent`; unknown extra fields are ignored
    (forward compatible). Missing required fields, wrong types, or bytes that are not
    msgpack raise.
    """
    if len(payload) > MAX_PAYLOAD:
        raise WireError(f"payload of {len(payload)} bytes exceeds {MAX_PAYLOAD}")
    try:
        obj = msgpack.unpackb(payload, raw=False, strict_map_key=False, use_list=True)
    except Exception as exc:  # msgpack raises several unrelated types
        raise WireError(f"payload is not msgpack: {type(exc).__name__}: {exc}") from exc
    if isinstance(obj, list):
        if len(obj) < 2:
            raise WireError(f"batch array has {len(obj)} elements, expected [ts, events, ...]")
        ts, events, rank = obj[0], obj[1], obj[2] if len(obj) > 2 else None
    elif isinstance(obj, dict):
        if "ts" not in obj or "events" not in obj:
            raise WireError("batch map lacks 'ts' or 'events'")
        ts, events = obj["ts"], obj["events"]
        rank = obj.get("data_parallel_rank", obj.get("attn_dp_rank"))
    else:
        raise WireError(f"batch is a {type(obj).__name__}, expected array or map")
    if isinstance(ts, bool) or not isinstance(ts, int | float) or not math.isfinite(ts):
        raise WireError(f"batch ts is {ts!r}, expected a finite number")
    if not isinstance(events, list):
        raise WireError(f"batch events is a {type(events).__name__}, expected array")
    decoded = tuple(_event(e, i, engine) for i, e in enumerate(events))
    return EngineBatch(float(ts), decoded, _opt_int(rank, "dp rank"))


_STORED = "BlockStored"
_REMOVED = "BlockRemoved"
_CLEARED = "AllBlocksCleared"
# Positional field names after the tag, per engine dialect.
_POSITIONAL: dict[tuple[Engine, str], tuple[str, ...]] = {
    (Engine.VLLM, _STORED): (
        "block_hashes",
        "parent_block_hash",
        "token_ids",
        "block_size",
        "lora_id",
        "medium",
        "lora_name",
        "extra_keys",
        "group_idx",
    ),
    (Engine.VLLM, _REMOVED): ("block_hashes", "medium", "group_idx"),
    (Engine.SGLANG, _STORED): (
        "block_hashes",
        "parent_block_hash",
        "token_ids",
        "block_size",
        "lora_id",
        "medium",
    ),
    (Engine.SGLANG, _REMOVED): ("block_hashes", "medium"),
}
_REQUIRED = {_STORED: ("block_hashes", "token_ids", "block_size"), _REMOVED: ("block_hashes",)}


def _event(obj: Any, index: int, engine: Engine) -> EngineEvent:
    try:
        tag, fields = _fields(obj, engine)
        if tag == _CLEARED:
            return AllCleared()
        if tag not in _REQUIRED:
            return UnknownEvent(tag)
        for name in _REQUIRED[tag]:
            if name not in fields:
                raise WireError(f"{tag} lacks {name}")
        hashes = _hashes(fields["block_hashes"])
        medium = _opt_str(fields.get("medium"), "medium")
        group = _opt_int(fields.get("group_idx"), "group_idx")
        if tag == _REMOVED:
            return BlockRemoved(hashes, medium, group)
        parent_raw = fields.get("parent_block_hash")
        parent = None if parent_raw is None else fold_hash(parent_raw)
        tokens = fields["token_ids"]
        if not isinstance(tokens, list):
            raise WireError(f"token_ids is a {type(tokens).__name__}, expected array")
        block_size = _opt_int(fields["block_size"], "block_size")
        if block_size is None or block_size < 0:
            raise WireError(f"block_size is {fields['block_size']!r}")
        token_count = len(tokens) if tokens else block_size * len(hashes)
        lora_name = _opt_str(fields.get("lora_name"), "lora_name")
        lora_id = _opt_int(fields.get("lora_id"), "lora_id")
        lora = lora_name or ("" if lora_id is None else str(lora_id))
        return BlockStored(hashes, parent, token_count, block_size, lora, medium, group)
    except WireError as exc:
        raise WireError(f"event {index}: {exc}") from None


def _fields(obj: Any, engine: Engine) -> tuple[str, Mapping[str, Any]]:
    """The tag and named fields of a positional (tagged array) or map-encoded event."""
    if isinstance(obj, list):
        if not obj or not isinstance(obj[0], str):
            raise WireError("tagged array without a string tag")
        names = _POSITIONAL.get((engine, obj[0]), ())
        return obj[0], dict(zip(names, obj[1:], strict=False))
    if isinstance(obj, dict):
        tag = obj.get("type")
        if not isinstance(tag, str):
            raise WireError("event map without a string 'type'")
        return tag, {k: v for k, v in obj.items() if isinstance(k, str)}
    raise WireError(f"event is a {type(obj).__name__}, expected array or map")


def _hashes(value: Any) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise WireError(f"block_hashes is a {type(value).__name__}, expected array")
    return tuple(fold_hash(h) for h in value)


def _opt_int(value: Any, name: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise WireError(f"{name} is {value!r}, expected an int")
    return value


def _opt_str(value: Any, name: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise WireError(f"{name} is {value!r}, expected a string")
    return value
