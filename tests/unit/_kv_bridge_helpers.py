"""Build vLLM / SGLang KV-event messages exactly as their publishers put them on the wire.

The engines encode msgspec structs with ``msgspec.msgpack.Encoder``: ``array_like=True``
structs become msgpack arrays of their fields in declaration order, with trailing fields
equal to their default left out (``omit_defaults=True``); map-encoded structs (vLLM after PR
#42892) become maps without default-valued fields. Tagged union members (``tag=True``) carry
their class name: as element 0 of the array, or under the key ``"type"`` of the map. ``bytes``
are msgpack bin, ``str`` msgpack str, floats float64. The ZMQ message is
``[topic, seq (8 bytes big-endian), payload]``.

Schemas below list ``(field, default)`` in declaration order; ``REQ`` = no default.
Sources: vllm-project/vllm vllm/distributed/kv_events.py (several versions),
sgl-project/sglang python/sglang/srt/disaggregation/kv_events.py.
"""

from __future__ import annotations

from typing import Any

import msgpack  # type: ignore[import-untyped]

REQ = object()

Schema = list[tuple[str, Any]]

# vLLM v0.9 (first release of KV events)
VLLM_V09_STORED: Schema = [
    ("block_hashes", REQ),
    ("parent_block_hash", REQ),
    ("token_ids", REQ),
    ("block_size", REQ),
    ("lora_id", REQ),
]
VLLM_V09_REMOVED: Schema = [("block_hashes", REQ)]
# vLLM 0.10 - 0.2x (array encoded; medium, lora_name, extra_keys, group_idx, spec fields added)
VLLM_STORED: Schema = [
    *VLLM_V09_STORED,
    ("medium", REQ),
    ("lora_name", REQ),
    ("extra_keys", None),
    ("group_idx", None),
    ("kv_cache_spec_kind", None),
    ("kv_cache_spec_sliding_window", None),
]
VLLM_REMOVED: Schema = [("block_hashes", REQ), ("medium", REQ), ("group_idx", None)]
VLLM_BATCH: Schema = [("ts", REQ), ("events", REQ), ("data_parallel_rank", None)]
# SGLang (array encoded; medium added later with a default)
SGLANG_STORED: Schema = [*VLLM_V09_STORED, ("medium", None)]
SGLANG_REMOVED: Schema = [("block_hashes", REQ), ("medium", None)]
SGLANG_BATCH: Schema = [("ts", REQ), ("events", REQ), ("attn_dp_rank", None)]


def _values(schema: Schema, values: dict[str, Any]) -> list[tuple[str, Any, bool]]:
    out = []
    for name, default in schema:
        if name not in values and default is REQ:
            raise KeyError(f"required field {name}")
        value = values.get(name, None if default is REQ else default)
        out.append((name, value, default is not REQ and value == default))
    return out


def as_array(tag: str | None, schema: Schema, **values: Any) -> list[Any]:
    """msgspec array_like encoding: declaration order, trailing defaults dropped."""
    fields = _values(schema, values)
    while fields and fields[-1][2]:
        fields.pop()
    body = [v for _, v, _ in fields]
    return [tag, *body] if tag is not None else body


def as_map(tag: str | None, schema: Schema, **values: Any) -> dict[str, Any]:
    """msgspec map encoding: ``type`` tag first, default-valued fields dropped."""
    out: dict[str, Any] = {"type": tag} if tag is not None else {}
    for name, value, is_default in _values(schema, values):
        if not is_default:
            out[name] = value
    return out


def pack(obj: Any) -> bytes:
    return bytes(msgpack.packb(obj, use_bin_type=True))


def frames(seq: int, payload: bytes, topic: bytes = b"") -> list[bytes]:
    """The 3 frames of one PUB message."""
    return [topic, seq.to_bytes(8, "big"), payload]


def vllm_payload(events: list[Any], ts: float = 1_700_000_000.5, rank: int | None = None) -> bytes:
    return pack(as_array(None, VLLM_BATCH, ts=ts, events=events, data_parallel_rank=rank))


def vllm_stored(
    hashes: list[Any],
    parent: Any = None,
    tokens: list[int] | None = None,
    block_size: int = 16,
    medium: str | None = "GPU",
    lora_id: int | None = None,
    lora_name: str | None = None,
    group_idx: int | None = None,
    as_map_encoding: bool = False,
) -> Any:
    tokens = tokens if tokens is not None else list(range(block_size * len(hashes)))
    values = dict(
        block_hashes=hashes,
        parent_block_hash=parent,
        token_ids=tokens,
        block_size=block_size,
        lora_id=lora_id,
        medium=medium,
        lora_name=lora_name,
        extra_keys=[None] * len(hashes) if as_map_encoding else None,
        group_idx=group_idx,
    )
    if as_map_encoding:
        values["kv_cache_spec_kind"] = "full_attention"
        return as_map("BlockStored", VLLM_STORED, **values)
    return as_array("BlockStored", VLLM_STORED, **values)


def vllm_removed(
    hashes: list[Any], medium: str | None = "GPU", as_map_encoding: bool = False
) -> Any:
    encode = as_map if as_map_encoding else as_array
    return encode("BlockRemoved", VLLM_REMOVED, block_hashes=hashes, medium=medium)


def vllm_cleared(as_map_encoding: bool = False) -> Any:
    return {"type": "AllBlocksCleared"} if as_map_encoding else ["AllBlocksCleared"]
