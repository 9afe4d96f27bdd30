"""A bucket <-> bytes, for the persisted 1-minute rollups (pure; exact round trip).

Layout (little-endian): magic ``b"TSB2"``; the :data:`~.bucket.COUNTERS` as float64
(integers up to 2**53 are exact); the sketches' relative accuracy (float64); the number of
sketches (uint16); per sketch: its name (uint8 length + ASCII), ``count, sum, min, max,
zero_count`` (5 x float64), the first bin's key (int32), the number of bins (uint32), the
bins' width (uint8: 4 = uint32 counts, the usual case, or 8 = float64) and the bins. Decoding
gives the query form (:class:`~.bucket.Summary`, numpy bins); ``Summary.bucket()`` rebuilds ``ddsketch`` sketches that
answer every quantile bit for bit as the encoded ones did.
"""

from __future__ import annotations

import struct

import numpy as np

from services.telemetry.windows.bucket import COUNTERS, Bucket, Summary
from services.telemetry.windows.dense import Dense, dense_of

__all__ = ["CodecError", "decode_bucket", "encode_bucket"]

_MAGIC = b"TSB2"
_HEAD = struct.Struct("<" + "d" * len(COUNTERS) + "dH")
_SKETCH = struct.Struct("<dddddiI")


class CodecError(ValueError):
    """Bytes that are not an encoded bucket."""


def encode_bucket(b: Bucket | Summary, relative_accuracy: float) -> bytes:
    counters = (
        b.counters.tolist() if isinstance(b, Summary) else [float(getattr(b, n)) for n in COUNTERS]
    )
    head = _HEAD.pack(*counters, relative_accuracy, len(b.sketches))
    parts = [_MAGIC, head]
    for name in sorted(b.sketches):
        sk = b.sketches[name]
        d = sk if isinstance(sk, Dense) else dense_of(sk, relative_accuracy)
        if d.accuracy != relative_accuracy:
            raise ValueError(f"sketch {name} has another relative accuracy")
        raw = name.encode()
        # whole counts below 2**32 (always, for unweighted adds) as uint32: half the bytes
        whole = bool(np.all((d.bins == np.floor(d.bins)) & (d.bins < 2**32)))
        bins = np.ascontiguousarray(d.bins, dtype="<u4" if whole else "<f8")
        parts.append(bytes([len(raw)]) + raw)
        parts.append(_SKETCH.pack(d.count, d.sum, d.lo, d.hi, d.zero, d.offset, len(bins)))
        parts.append(b"\x04" if whole else b"\x08")
        parts.append(bins.tobytes())
    return b"".join(parts)


def decode_bucket(data: bytes) -> tuple[Summary, float]:
    """The bucket (query form) and the relative accuracy it was encoded with; CodecError if
    malformed."""
    if not data.startswith(_MAGIC):
        raise CodecError("not an encoded bucket (bad magic)")
    try:
        values = _HEAD.unpack_from(data, len(_MAGIC))
        pos = len(_MAGIC) + _HEAD.size
        b = Summary(np.array(values[: len(COUNTERS)], dtype=np.float64))
        accuracy, n = values[-2], values[-1]
        for _ in range(n):
            size = data[pos]
            name = data[pos + 1 : pos + 1 + size].decode()
            pos += 1 + size
            count, total, lo, hi, zero, offset, nbins = _SKETCH.unpack_from(data, pos)
            width = data[pos + _SKETCH.size]
            pos += _SKETCH.size + 1
            if width not in (4, 8) or pos + width * nbins > len(data):
                raise CodecError("bad or truncated bins")
            raw_bins = np.frombuffer(data, "<u4" if width == 4 else "<f8", nbins, pos)
            bins = raw_bins.astype(np.float64)
            pos += width * nbins
            b.sketches[name] = Dense(accuracy, offset, bins, zero, count, total, lo, hi)
    except (struct.error, IndexError, UnicodeDecodeError, ValueError) as exc:
        if isinstance(exc, CodecError):
            raise
        raise CodecError(f"truncated or corrupt bucket: {exc}") from exc
    if pos != len(data):
        raise CodecError(f"{len(data) - pos} trailing bytes")
    return b, accuracy
