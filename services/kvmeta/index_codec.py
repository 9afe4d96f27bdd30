"""Snapshot codec of the prefix index: compact bytes for checkpoints.

Layout (little-endian, zlib-compressed): magic, then per deployment its slot bookkeeping,
instances (slot, epoch, last seq, stale | syncing << 1, last seen, block count) and tables; a table is
(tenant, lora, tier), its keys as ``array('Q')``, holder values as ``array('q')`` (negative:
``~slot`` for a single slot, or a packed pair as in :mod:`services.common.kvindex.slots`;
non-negative: an index into the table's bitmasks, stored as length-prefixed little-endian
bytes). Decoding gives the holder values of :mod:`services.common.kvindex.slots` (canonical).
"""

from __future__ import annotations

import struct
import zlib
from array import array

from services.common.kvindex.sequencer import SeqState
from services.common.kvindex.slots import (
    PAIR_BASE,
    IndexState,
    InstState,
    holder_from_mask,
    holder_mask,
    slot_bit,
)

__all__ = ["compress_snapshot", "decode", "encode"]


def compress_snapshot(raw: bytes) -> bytes:
    """``snapshot()`` bytes from ``snapshot_raw()`` bytes."""
    return zlib.compress(raw, 1)


_MAGIC = b"KVIX1"


def _pack_str(out: list[bytes], s: str) -> None:
    b = s.encode("utf-8")
    out.append(struct.pack("<I", len(b)))
    out.append(b)


def encode(deps: dict[str, IndexState]) -> bytes:
    """Uncompressed snapshot bytes of ``deps`` (see ``compress_snapshot``)."""
    out: list[bytes] = [_MAGIC, struct.pack("<I", len(deps))]
    for name, dep in deps.items():
        _pack_str(out, name)
        retired = dep.retired.to_bytes((dep.retired.bit_length() + 7) // 8, "little")
        out.append(struct.pack("<II", dep.next_slot, len(retired)))
        out.append(retired)
        free = array("I", dep.free)
        out.append(struct.pack("<I", len(free)))
        out.append(free.tobytes())
        out.append(struct.pack("<I", len(dep.instances)))
        for inst in dep.instances.values():
            _pack_str(out, inst.instance_id)
            sq = inst.seq
            out.append(
                struct.pack(
                    "<IqqBdq",
                    inst.slot,
                    sq.epoch,
                    sq.last_seq,
                    sq.stale | sq.syncing << 1,  # old readers: bool(byte) = stale
                    inst.last_seen,
                    inst.blocks,
                )
            )
        tables = [(k, t, d) for k, sp in dep.spaces.items() for t, d in sp.items()]
        out.append(struct.pack("<I", len(tables)))
        for (tenant, lora), tier, d in tables:
            _pack_str(out, tenant)
            _pack_str(out, lora)
            keys = array("Q", d.keys())
            vals = array("q")
            masks: list[bytes] = []
            for v in d.values():
                if v < 0:
                    vals.append(v)
                elif v & (v - 1) == 0:
                    vals.append(~(v.bit_length() - 1))
                else:
                    vals.append(len(masks))
                    masks.append(v.to_bytes((v.bit_length() + 7) // 8, "little"))
            mlens = array("I", [len(b) for b in masks])
            out.append(struct.pack("<BQI", tier, len(keys), len(masks)))
            out.append(keys.tobytes())
            out.append(vals.tobytes())
            out.append(mlens.tobytes())
            out.append(b"".join(masks))
    return b"".join(out)


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.buf = memoryview(data)
        self.pos = 0

    def take(self, n: int) -> memoryview:
        if self.pos + n > len(self.buf):
            raise ValueError("truncated index snapshot")
        v = self.buf[self.pos : self.pos + n]
        self.pos += n
        return v

    def unpack(self, fmt: str) -> tuple[int, ...]:
        size = struct.calcsize(fmt)
        return struct.unpack(fmt, self.take(size))

    def string(self) -> str:
        (n,) = self.unpack("<I")
        return bytes(self.take(n)).decode("utf-8")


def _holder(v: int) -> int:
    """Canonical holder value of a stored negative value (a single slot or a pair)."""
    if v > -PAIR_BASE:
        return slot_bit(~v)
    m = holder_from_mask(holder_mask(v))
    assert m is not None
    return m


def decode(data: bytes) -> dict[str, IndexState]:
    """Deployments from ``compress_snapshot(encode(...))`` bytes. Raises ValueError."""
    try:
        raw = zlib.decompress(data)
    except zlib.error as exc:
        raise ValueError(f"corrupt index snapshot: {exc}") from exc
    if not raw.startswith(_MAGIC):
        raise ValueError("not an index snapshot")
    r = _Reader(raw)
    r.take(len(_MAGIC))
    deps: dict[str, IndexState] = {}
    try:
        (ndeps,) = r.unpack("<I")
        for _ in range(ndeps):
            name = r.string()
            dep = IndexState()
            dep.next_slot, rlen = r.unpack("<II")
            dep.retired = int.from_bytes(r.take(rlen), "little")
            (nfree,) = r.unpack("<I")
            dep.free = array("I", bytes(r.take(4 * nfree))).tolist()
            (ninst,) = r.unpack("<I")
            for _ in range(ninst):
                iid = r.string()
                slot, epoch, last_seq, stale, seen, blocks = struct.unpack(
                    "<IqqBdq", r.take(struct.calcsize("<IqqBdq"))
                )
                sq = SeqState(epoch, last_seq, bool(stale & 1), bool(stale & 2))
                inst = InstState(iid, slot, sq, seen, blocks)
                dep.instances[iid] = inst
                dep.owners[slot] = inst
                if not sq.stale:
                    dep.live |= 1 << slot
            (ntables,) = r.unpack("<I")
            for _ in range(ntables):
                tenant, lora = r.string(), r.string()
                tier, nkeys, nmasks = r.unpack("<BQI")
                keys = array("Q", bytes(r.take(8 * nkeys)))
                vals = array("q", bytes(r.take(8 * nkeys)))
                mlens = array("I", bytes(r.take(4 * nmasks)))
                masks: list[int] = []
                for ml in mlens:
                    masks.append(int.from_bytes(r.take(ml), "little"))
                values = [masks[v] if v >= 0 else _holder(v) for v in vals]
                space = dep.spaces.setdefault((tenant, lora), {})
                space[tier] = dict(zip(keys, values, strict=True))
            deps[name] = dep
    except (struct.error, IndexError, UnicodeDecodeError) as exc:
        raise ValueError(f"corrupt index snapshot: {exc}") from exc
    return deps
