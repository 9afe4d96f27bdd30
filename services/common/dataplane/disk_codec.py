"""Byte formats of the disk segment's index (pure): write-ahead log records and snapshots.

A log file is ``WAL_MAGIC`` then records, each ``<u32 length><u32 CRC-32 of the payload>
<payload>``; a payload is ``<u8 op><u16 tenant length><u16 key length>tenant key`` and, for a
put, ``<u64 offset><u64 size><u32 block CRC-32>``. A crash can leave the last record torn
(short, or its checksum wrong): :func:`decode_wal` returns the records before it and the
length of the good prefix, which the shell truncates the file to. A record is only appended
after the previous ones were fsynced, so anything after a bad record is the torn tail.

A snapshot is ``SNAP_MAGIC``, ``<u64 generation><u64 count>``, ``count`` payloads each with
their ``<u32 length>``, then the CRC-32 of all that. It is written to a temporary file,
fsynced and renamed, so it is whole or absent; a bad one raises :class:`CorruptSnapshot`.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterable
from dataclasses import dataclass

from services.common.dataplane.disk_index import DiskBlock, Drop, Put, Record

__all__ = [
    "SNAP_MAGIC",
    "WAL_MAGIC",
    "CorruptSnapshot",
    "WalContents",
    "decode_snapshot",
    "decode_wal",
    "encode_record",
    "encode_snapshot",
]

WAL_MAGIC = b"TSDWAL01"
SNAP_MAGIC = b"TSDSNP01"
_HEAD = struct.Struct("<II")  # payload length, payload CRC-32
_KEYS = struct.Struct("<BHH")  # op, tenant length, key length
_PUT = struct.Struct("<QQI")  # offset, size, block CRC-32
_SNAP = struct.Struct("<QQ")  # generation, count
_LEN = struct.Struct("<I")
_OP_PUT, _OP_DROP = 1, 2
_MAX_PAYLOAD = 1 << 20  # a longer length is garbage, not a record


class CorruptSnapshot(ValueError):
    """The snapshot's magic, length or checksum is wrong."""


def _payload(record: Record) -> bytes:
    if isinstance(record, Put):
        b = record.block
        t, k = b.tenant.encode(), b.key.encode()
        tail = _PUT.pack(b.offset, b.size, b.crc)
        return _KEYS.pack(_OP_PUT, len(t), len(k)) + t + k + tail
    t, k = record.tenant.encode(), record.key.encode()
    return _KEYS.pack(_OP_DROP, len(t), len(k)) + t + k


def _parse(payload: bytes) -> Record:
    """ValueError (or struct.error) when the payload is not a record."""
    op, nt, nk = _KEYS.unpack_from(payload)
    pos = _KEYS.size
    tenant = payload[pos : pos + nt].decode()
    key = payload[pos + nt : pos + nt + nk].decode()
    pos += nt + nk
    if op == _OP_DROP and pos == len(payload):
        return Drop(tenant, key)
    if op == _OP_PUT and pos + _PUT.size == len(payload):
        offset, size, crc = _PUT.unpack_from(payload, pos)
        return Put(DiskBlock(tenant, key, offset, size, crc))
    raise ValueError(f"bad record: op {op}, {len(payload)} bytes")


def encode_record(record: Record) -> bytes:
    payload = _payload(record)
    return _HEAD.pack(len(payload), zlib.crc32(payload)) + payload


@dataclass(frozen=True)
class WalContents:
    records: list[Record]
    good: int  # length of the file's good prefix (magic + whole records)
    torn: bool  # bytes after the good prefix (a torn or garbled tail)


def decode_wal(data: bytes) -> WalContents:
    """The records of a log file up to its first torn or bad record. A file shorter than
    its magic (created, then the crash) holds nothing; a wrong magic raises ValueError."""
    if len(data) < len(WAL_MAGIC):
        if WAL_MAGIC.startswith(data):
            return WalContents([], 0, bool(data))
        raise ValueError("not a disk-tier log (bad magic)")
    if not data.startswith(WAL_MAGIC):
        raise ValueError("not a disk-tier log (bad magic)")
    pos, records = len(WAL_MAGIC), []
    while pos + _HEAD.size <= len(data):
        length, crc = _HEAD.unpack_from(data, pos)
        start = pos + _HEAD.size
        payload = data[start : start + length]
        if length > _MAX_PAYLOAD or len(payload) < length or zlib.crc32(payload) != crc:
            break
        try:
            records.append(_parse(payload))
        except (ValueError, struct.error, UnicodeDecodeError):
            break
        pos = start + length
    return WalContents(records, pos, pos < len(data))


def encode_snapshot(generation: int, blocks: Iterable[DiskBlock]) -> bytes:
    payloads = [_payload(Put(b)) for b in blocks]
    body = bytearray(SNAP_MAGIC + _SNAP.pack(generation, len(payloads)))
    for p in payloads:
        body += _LEN.pack(len(p)) + p
    return bytes(body) + _LEN.pack(zlib.crc32(body))


def decode_snapshot(data: bytes) -> tuple[int, list[DiskBlock]]:
    """(generation, blocks) of a whole snapshot; CorruptSnapshot otherwise."""
    head = len(SNAP_MAGIC) + _SNAP.size
    if len(data) < head + _LEN.size or not data.startswith(SNAP_MAGIC):
        raise CorruptSnapshot("snapshot too short or bad magic")
    body, (crc,) = data[: -_LEN.size], _LEN.unpack_from(data, len(data) - _LEN.size)
    if zlib.crc32(body) != crc:
        raise CorruptSnapshot("snapshot checksum mismatch")
    generation, count = _SNAP.unpack_from(body, len(SNAP_MAGIC))
    pos, blocks = head, []
    try:
        for _ in range(count):
            (n,) = _LEN.unpack_from(body, pos)
            rec = _parse(body[pos + _LEN.size : pos + _LEN.size + n])
            if not isinstance(rec, Put):
                raise CorruptSnapshot("snapshot holds a drop record")
            blocks.append(rec.block)
            pos += _LEN.size + n
    except (ValueError, struct.error, UnicodeDecodeError) as err:
        if isinstance(err, CorruptSnapshot):
            raise
        raise CorruptSnapshot(f"snapshot entry {len(blocks)}: {err}") from err
    if pos != len(body):
        raise CorruptSnapshot("snapshot has trailing bytes")
    return generation, blocks
