"""Stream entry format (pure): names, protobuf entries, dead letters, reply shapes.

Entry format: two fields, ``"t"`` = the message's full protobuf name (e.g.
``tideserve.v1.KVEventBatch``) and ``"p"`` = its serialized bytes. An entry that cannot be
decoded is copied as a ``tideserve.v1.DeadLetter`` to ``{stream}:dead`` by the readers
that dead-letter.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

import redis.asyncio as aioredis
from google.protobuf.message import DecodeError, Message
from tideserve.v1 import events_pb2

__all__ = [
    "DEAD_SUFFIX",
    "PayloadError",
    "dead_letter",
    "dead_letter_stream",
    "decode_entry",
    "encode_entry",
    "stream_entries",
    "stream_name",
]

M = TypeVar("M", bound=Message)

DEAD_SUFFIX = ":dead"
TYPE_FIELD = b"t"
PAYLOAD_FIELD = b"p"


def stream_name(prefix: str, kind: str, deployment: str | None = None) -> str:
    """``{prefix}:{kind}`` or ``{prefix}:{kind}:{deployment}`` (e.g. ``ts:kv:llama``)."""
    if not prefix or not kind:
        raise ValueError("stream prefix and kind must be non-empty")
    return f"{prefix}:{kind}" if deployment is None else f"{prefix}:{kind}:{deployment}"


def dead_letter_stream(stream: str) -> str:
    """Where undecodable entries of ``stream`` go."""
    return stream + DEAD_SUFFIX


class PayloadError(ValueError):
    """A stream entry that is not a valid encoding of the expected message type."""


def encode_entry(msg: Message) -> dict[bytes, bytes]:
    """Fields of the stream entry carrying ``msg``."""
    return {
        TYPE_FIELD: msg.DESCRIPTOR.full_name.encode(),
        PAYLOAD_FIELD: msg.SerializeToString(),
    }


def _field(fields: Mapping[Any, Any], name: bytes) -> bytes | None:
    value = fields.get(name)
    if value is None:
        value = fields.get(name.decode())
    if value is None:
        return None
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, bytes):
        return value
    return None


def decode_entry(fields: Mapping[Any, Any] | None, message_type: type[M]) -> M:
    """Parse an entry's fields into ``message_type``.

    Raises ``PayloadError`` (one-line message) when the fields are missing, name another
    type, or the bytes do not parse.
    """
    if fields is None:
        raise PayloadError("entry has no fields")
    type_name = _field(fields, TYPE_FIELD)
    payload = _field(fields, PAYLOAD_FIELD)
    expected = message_type.DESCRIPTOR.full_name
    if type_name is None or payload is None:
        raise PayloadError('entry lacks the "t" or "p" field')
    if type_name.decode(errors="replace") != expected:
        raise PayloadError(f"type {type_name.decode(errors='replace')!r}, expected {expected!r}")
    msg = message_type()
    try:
        msg.ParseFromString(payload)
    except (DecodeError, ValueError) as exc:
        raise PayloadError(f"payload does not parse as {expected}: {exc}") from exc
    return msg


def dead_letter(
    stream: str,
    entry_id: str,
    group: str,
    error: str,
    fields: Mapping[Any, Any] | None,
    now_ms: int,
) -> events_pb2.DeadLetter:
    """The DeadLetter record for an undecodable entry (field values kept as bytes)."""
    raw: dict[str, bytes] = {}
    for key, value in (fields or {}).items():
        k = key.decode(errors="replace") if isinstance(key, bytes) else str(key)
        raw[k] = value if isinstance(value, bytes) else str(value).encode()
    return events_pb2.DeadLetter(
        stream=stream, entry_id=entry_id, group=group, error=error, fields=raw, ts_ms=now_ms
    )


def stream_entries(reply: Any) -> list[tuple[Any, list[Any]]]:
    """Normalise XREAD/XREADGROUP replies (RESP2 list or RESP3 dict) to [(stream, entries)]."""
    if not reply:
        return []
    if isinstance(reply, dict):
        return [(k, v[0] if v and isinstance(v[0], list) else v) for k, v in reply.items()]
    return [(name, entries) for name, entries in reply]


def one_line(exc: BaseException) -> str:
    """An exception as one line of text (for logs and dead letters)."""
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def require_bytes_client(client: aioredis.Redis) -> None:
    """ValueError unless ``client`` returns bytes (payloads are binary)."""
    kwargs = client.connection_pool.connection_kwargs
    if kwargs.get("decode_responses"):
        raise ValueError("streams need a Redis client with decode_responses=False")
