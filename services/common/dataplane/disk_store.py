"""Files of a disk segment (shell): the block file mapped into memory, and the durable index
(snapshot + write-ahead log). Every call here blocks on the disk: an asyncio caller runs
them with ``asyncio.to_thread``, one at a time.

* :class:`FileArena`: ``blocks.dat`` (fully allocated with ``posix_fallocate``, so a full
  disk fails at start, not as a SIGBUS on a later write) mapped shared at a fixed address
  derived from its path when that address is free (``MAP_FIXED_NOREPLACE``): the segment
  keeps its address across restarts, so kvmeta's replica offsets stay valid and a restarted
  instance re-mounts the same segment. The Transfer Engine reads and writes it like any
  registered memory; the page cache is the DRAM in front of the disk. ``flush`` = ``msync``.
* :class:`DiskLog`: ``snapshot.bin`` + ``wal-<generation>.log`` in the directory.
  :meth:`DiskLog.open` replays the snapshot and every log of its generation or later,
  truncates a torn last record, and removes logs a snapshot made obsolete.
  :meth:`DiskLog.append` writes records and fsyncs (the acknowledgement point).
  :meth:`DiskLog.compact` starts a new log, then writes the snapshot of the index as it was
  at the switch (temporary file, fsync, rename, fsync of the directory), then deletes the
  older logs: a crash anywhere in it replays to the same index.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import logging
import mmap
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from services.common.dataplane.disk_codec import (
    WAL_MAGIC,
    decode_snapshot,
    decode_wal,
    encode_record,
    encode_snapshot,
)
from services.common.dataplane.disk_index import DiskIndex, Record
from services.common.dataplane.transfer import Arena

__all__ = ["DiskLog", "FileArena", "Replay"]

log = logging.getLogger(__name__)

_MAP_FIXED_NOREPLACE = 0x100000
_MS_SYNC = 4
_MAP_FAILED = ctypes.c_void_p(-1).value
_HINT_BASE = 0x2000_0000_0000  # far below where Linux maps by default (top-down from 0x7f..)
_PAGE = mmap.PAGESIZE
_WAL = re.compile(r"^wal-(\d{12})\.log$")

_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_long,
]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.msync.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class FileArena(Arena):
    """``size`` bytes of ``path`` mapped shared; ``base`` is stable across restarts when the
    derived address is free (``stable`` says whether it was)."""

    def __init__(self, path: Path, size: int) -> None:
        # Not Arena.__init__: that one maps anonymous memory.
        if size <= 0 or size % _PAGE:
            raise ValueError(f"disk segment size must be a positive multiple of {_PAGE}")
        self.size = size
        self.path = path
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if os.fstat(fd).st_size < size:
                os.posix_fallocate(fd, 0, size)
                os.fsync(fd)  # the file and its size outlive a machine crash, as the log does
                _fsync_dir(path.parent)
            hint = _HINT_BASE + (int(hashlib.sha256(str(path).encode()).hexdigest()[:3], 16) << 32)
            prot, shared = mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED
            addr = _libc.mmap(hint, size, prot, shared | _MAP_FIXED_NOREPLACE, fd, 0)
            if addr in (None, _MAP_FAILED):
                addr = _libc.mmap(None, size, prot, shared, fd, 0)
            if addr in (None, _MAP_FAILED):
                err = ctypes.get_errno()
                raise OSError(err, f"mmap of {path}: {os.strerror(err)}")
        finally:
            os.close(fd)  # the mapping keeps the file open
        self.base = int(addr)
        self.stable = self.base == hint
        self._view: memoryview | None = memoryview((ctypes.c_char * size).from_address(addr)).cast(
            "B"
        )

    def write(self, offset: int, data: bytes) -> None:
        self._check(offset, len(data))
        self._live()[offset : offset + len(data)] = data

    def read(self, offset: int, length: int) -> bytes:
        self._check(offset, length)
        return bytes(self._live()[offset : offset + length])

    def view(self, offset: int, length: int) -> memoryview:
        """The bytes in place (no copy), e.g. for a checksum."""
        self._check(offset, length)
        return self._live()[offset : offset + length]

    def flush(self, ranges: Sequence[tuple[int, int]]) -> None:
        """``msync`` the pages of each (offset, length) to the disk, adjacent or
        overlapping ranges as one call (a batch placed first-fit is usually one range)."""
        spans: list[list[int]] = []
        for offset, length in sorted(ranges):
            self._check(offset, length)
            start = offset - offset % _PAGE
            if spans and start <= spans[-1][1]:
                spans[-1][1] = max(spans[-1][1], offset + length)
            else:
                spans.append([start, offset + length])
        for start, end in spans:
            if _libc.msync(self.base + start, end - start, _MS_SYNC) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"msync of {self.path}: {os.strerror(err)}")

    def close(self) -> None:
        if self._view is not None:
            self._view.release()
            self._view = None
            _libc.munmap(self.base, self.size)

    def _live(self) -> memoryview:
        if self._view is None:
            raise ValueError("the disk arena is closed")
        return self._view


@dataclass(frozen=True)
class Replay:
    """What :meth:`DiskLog.open` found."""

    snapshot_blocks: int
    wal_records: int
    torn_bytes: int  # cut off the end of a log (a record torn by a crash)


class DiskLog:
    """The durable index in ``root`` (see the module's docstring)."""

    def __init__(self, root: Path, generation: int, records: int) -> None:
        self.root = root
        self.generation = generation
        self.records = records  # in the current log, i.e. since the last snapshot
        self._fd = os.open(self._wal(generation), os.O_WRONLY | os.O_APPEND)

    @classmethod
    def open(cls, root: Path) -> tuple[DiskLog, DiskIndex, Replay]:
        root.mkdir(parents=True, exist_ok=True)
        snap = root / "snapshot.bin"
        generation, blocks = decode_snapshot(snap.read_bytes()) if snap.exists() else (0, [])
        index = DiskIndex(blocks)
        logs = sorted((int(m[1]), root / m[0]) for p in root.iterdir() if (m := _WAL.match(p.name)))
        replayed, torn, current_records = 0, 0, 0
        for gen, path in logs:
            if gen < generation:
                path.unlink()  # a compaction wrote the snapshot but died before this
                continue
            data = path.read_bytes()
            got = decode_wal(data)
            for record in got.records:
                index.apply(record)
            replayed += len(got.records)
            current_records = len(got.records)
            if got.torn or got.good < len(WAL_MAGIC):
                torn += len(data) - got.good
                log.warning("%s: cut %d bytes of a torn tail", path, len(data) - got.good)
                cls._rewrite_head(path, data[: got.good])
            generation = max(generation, gen)
        if not logs or logs[-1][0] < generation:
            cls._create_wal(root, generation)
            current_records = 0
        return cls(root, generation, current_records), index, Replay(len(blocks), replayed, torn)

    def append(self, records: Sequence[Record]) -> None:
        """Write ``records`` and fsync: when this returns they survive a crash."""
        if records:
            os.write(self._fd, b"".join(encode_record(r) for r in records))
            os.fsync(self._fd)
            self.records += len(records)

    def compact(self, index: DiskIndex) -> None:
        """Snapshot ``index`` and drop the logs it covers."""
        generation = self.generation + 1
        self._create_wal(self.root, generation)
        old_fd, self._fd = self._fd, os.open(self._wal(generation), os.O_WRONLY | os.O_APPEND)
        os.close(old_fd)
        self.generation, self.records = generation, 0
        tmp = self.root / "snapshot.tmp"
        with tmp.open("wb") as f:
            f.write(encode_snapshot(generation, index.blocks()))
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(self.root / "snapshot.bin")
        _fsync_dir(self.root)
        for p in self.root.iterdir():
            if (m := _WAL.match(p.name)) and int(m[1]) < generation:
                p.unlink()

    def close(self) -> None:
        os.close(self._fd)

    def _wal(self, generation: int) -> Path:
        return self.root / f"wal-{generation:012d}.log"

    @staticmethod
    def _create_wal(root: Path, generation: int) -> None:
        path = root / f"wal-{generation:012d}.log"
        with path.open("wb") as f:
            f.write(WAL_MAGIC)
            f.flush()
            os.fsync(f.fileno())
        _fsync_dir(root)

    @staticmethod
    def _rewrite_head(path: Path, good: bytes) -> None:
        """Truncate ``path`` to its good prefix (a magic at least) and fsync."""
        with path.open("r+b") as f:
            if len(good) < len(WAL_MAGIC):
                f.seek(0)
                f.write(WAL_MAGIC)
                good = WAL_MAGIC
            f.truncate(len(good))
            f.flush()
            os.fsync(f.fileno())
