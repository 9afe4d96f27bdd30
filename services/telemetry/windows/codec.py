"""A bucket <-> bytes, for the persisted 1-minute rollups (pure; exact round trip).

Layout (little-endian): magic ``b"TSB1"``; the :data:`~.bucket.COUNTERS` as float64 (integers
up to 2**53 are exact); the sketches' relative accuracy (float64); the number of sketches
(uint16); per sketch: its name (uint8 length + ASCII), ``count, sum, min, max`` (4 x float64)
and its bins as a ``DDSketch`` protobuf (ddsketch's own ``DDSketchProto``; uint32 length +
bytes). The protobuf carries neither sum, min nor max, hence the four floats; the index
mapping is rebuilt from the relative accuracy (not from the serialized gamma, which would
round), so decoded sketches answer every quantile bit for bit as the encoded ones did.
"""

from __future__ import annotations

import struct
from typing import Any

from ddsketch.ddsketch import BaseDDSketch
from ddsketch.mapping import LogarithmicMapping
from ddsketch.pb import proto as _ddproto

from services.telemetry.windows.bucket import COUNTERS, Bucket

__all__ = ["CodecError", "decode_bucket", "encode_bucket"]

# ddsketch's protobuf helpers are untyped.
_SKETCH_PROTO: Any = _ddproto.DDSketchProto
_STORE_PROTO: Any = _ddproto.StoreProto
_PB: Any = getattr(_ddproto, "pb")  # noqa: B009 (not re-exported)

_MAGIC = b"TSB1"
_HEAD = struct.Struct("<" + "d" * len(COUNTERS) + "dH")
_SKETCH = struct.Struct("<ddddI")
_INT_COUNTERS = frozenset(n for n in COUNTERS if isinstance(getattr(Bucket(), n), int))


class CodecError(ValueError):
    """Bytes that are not an encoded bucket."""


def encode_bucket(b: Bucket, relative_accuracy: float) -> bytes:
    parts = [
        _MAGIC,
        _HEAD.pack(*(float(getattr(b, n)) for n in COUNTERS), relative_accuracy, len(b.sketches)),
    ]
    for name in sorted(b.sketches):
        sk = b.sketches[name]
        if sk._mapping.relative_accuracy != relative_accuracy:
            raise ValueError(f"sketch {name} has another relative accuracy")
        body = _SKETCH_PROTO.to_proto(sk).SerializeToString()
        raw = name.encode()
        parts.append(bytes([len(raw)]) + raw)
        # count/sum/min/max are the sketch's own; ddsketch has no public setter for them.
        parts.append(_SKETCH.pack(sk.count, sk.sum, sk._min, sk._max, len(body)))
        parts.append(body)
    return b"".join(parts)


def decode_bucket(data: bytes) -> tuple[Bucket, float]:
    """The bucket and the relative accuracy it was encoded with; CodecError if malformed."""
    if not data.startswith(_MAGIC):
        raise CodecError("not an encoded bucket (bad magic)")
    try:
        values = _HEAD.unpack_from(data, len(_MAGIC))
        pos = len(_MAGIC) + _HEAD.size
        b = Bucket()
        for name, value in zip(COUNTERS, values, strict=False):
            setattr(b, name, int(value) if name in _INT_COUNTERS else value)
        accuracy, n = values[-2], values[-1]
        for _ in range(n):
            size = data[pos]
            name = data[pos + 1 : pos + 1 + size].decode()
            pos += 1 + size
            count, total, lo, hi, length = _SKETCH.unpack_from(data, pos)
            pos += _SKETCH.size
            proto = _PB.DDSketch.FromString(data[pos : pos + length])
            pos += length
            b.sketches[name] = _sketch(proto, accuracy, count, total, lo, hi)
    except (struct.error, IndexError, UnicodeDecodeError) as exc:
        raise CodecError(f"truncated or corrupt bucket: {exc}") from exc
    if pos != len(data):
        raise CodecError(f"{len(data) - pos} trailing bytes")
    return b, accuracy


def _sketch(
    proto: Any, accuracy: float, count: float, total: float, lo: float, hi: float
) -> BaseDDSketch:
    sk = BaseDDSketch(
        mapping=LogarithmicMapping(accuracy),
        store=_STORE_PROTO.from_proto(proto.positiveValues),
        negative_store=_STORE_PROTO.from_proto(proto.negativeValues),
        zero_count=proto.zeroCount,
    )
    if sk.count != count:
        raise CodecError(f"sketch count {sk.count} != recorded {count}")
    sk._sum, sk._min, sk._max = total, lo, hi
    return sk
