"""The shell around Mooncake's Transfer Engine: start it on kvmeta's metadata endpoint,
register arenas, move batches of byte ranges, stop it.

Every native call blocks (initialisation talks HTTP to kvmeta, a batch waits for its last
slice), so each runs on this wrapper's own small thread pool (``settings.workers``), never on
the event loop and never on a daemon thread. A batch not done after its timeout raises
:class:`TransferTimeout`, which carries the still-running call: the caller must not reuse the
destination buffers before it ends (:meth:`TransferTimeout.pending`).

Memory: one :class:`Arena` per engine (an anonymous ``mmap``, so untouched pages cost
nothing) registered once, blocks carved from it by offset. One registration rather than one
per block because each ``register_memory`` rewrites the engine's segment descriptor in kvmeta
(an HTTP PUT listing every buffer) and, with RDMA, pins and maps a memory region (slow, and
NICs limit their number).

The native library is loaded on first use (:func:`load_transfer_engine`); when it cannot
load, :class:`DataPlaneUnavailable` names the package and the system libraries.

TCP: the Transfer Engine binds its RPC and data sockets to ``MC_TCP_BIND_ADDRESS``; unless the
environment sets it, :meth:`DataPlane.start` sets it to the host of ``settings.hostname``.
"""

from __future__ import annotations

import asyncio
import ctypes
import mmap
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from services.common.dataplane.settings import DataPlaneSettings

__all__ = [
    "Arena",
    "DataPlane",
    "DataPlaneError",
    "DataPlaneUnavailable",
    "Transfer",
    "TransferError",
    "TransferTimeout",
    "load_transfer_engine",
]

T = TypeVar("T")

INSTALL_HINT = (
    "install the PyPI package mooncake-transfer-engine-non-cuda (mooncake-transfer-engine on "
    "CUDA hosts; extra tideserve[transfer]; Linux x86_64/aarch64, CPython 3.10-3.13) and the "
    "system libraries libibverbs1 and libnuma1 (make system-deps, or "
    "sudo apt-get install -y libibverbs1 libnuma1)"
)


class DataPlaneError(RuntimeError):
    """The Transfer Engine refused something (a non-zero return code)."""


class DataPlaneUnavailable(DataPlaneError):
    """The native library cannot be loaded."""


class TransferError(DataPlaneError):
    """A batch failed (its return code is in the message)."""


class TransferTimeout(TransferError):
    """A batch did not finish in time; ``pending`` completes when the native call returns."""

    def __init__(self, message: str, pending: asyncio.Future[Any]) -> None:
        super().__init__(message)
        self.pending = pending


def load_transfer_engine() -> type[Any]:
    """``mooncake.engine.TransferEngine``, or :class:`DataPlaneUnavailable` saying what to
    install."""
    try:
        from mooncake.engine import TransferEngine  # type: ignore[import-untyped]
    except ImportError as exc:  # the wheel, or libibverbs.so.1 / libnuma.so.1, is missing
        raise DataPlaneUnavailable(
            f"the Mooncake Transfer Engine cannot be loaded ({exc}): {INSTALL_HINT}"
        ) from exc
    return TransferEngine  # type: ignore[no-any-return]


class Arena:
    """``size`` bytes of anonymous memory at a fixed address (``base``)."""

    def __init__(self, size: int) -> None:
        if size <= 0:
            raise ValueError("arena size must be positive")
        self.size = size
        self._mm = mmap.mmap(-1, size)
        self._anchor: ctypes.c_char | None = ctypes.c_char.from_buffer(self._mm)
        self.base = ctypes.addressof(self._anchor)

    def write(self, offset: int, data: bytes) -> None:
        self._check(offset, len(data))
        self._mm[offset : offset + len(data)] = data

    def read(self, offset: int, length: int) -> bytes:
        self._check(offset, length)
        return self._mm[offset : offset + length]

    def close(self) -> None:
        if self._anchor is not None:
            self._anchor = None  # release the buffer export, then the mapping
            self._mm.close()

    def _check(self, offset: int, length: int) -> None:
        if offset < 0 or length < 0 or offset + length > self.size:
            raise ValueError(
                f"range [{offset}, {offset + length}) outside the arena of {self.size}"
            )


@dataclass(frozen=True)
class Transfer:
    """A finished batch: bytes moved and wall time in milliseconds."""

    nbytes: int
    ms: float


class DataPlane:
    """One Transfer Engine instance. ``native``: the engine class (default: Mooncake's,
    loaded now, so a missing library fails at construction)."""

    def __init__(
        self,
        settings: DataPlaneSettings,
        *,
        native: type[Any] | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.settings = settings
        self._native = native if native is not None else load_transfer_engine()
        self._clock = clock
        self._engine: Any = None
        self._pool: ThreadPoolExecutor | None = None
        self._arenas: list[Arena] = []
        self.transfers = 0
        self.failures = 0
        self.bytes_moved = 0

    @property
    def segment(self) -> str:
        """This engine's segment name (what peers pass as ``peer``)."""
        return self.settings.hostname

    @property
    def started(self) -> bool:
        return self._engine is not None

    async def start(self) -> None:
        """Initialise on the metadata server; :class:`DataPlaneError` if it refuses."""
        s = self.settings
        if s.protocol == "tcp":
            os.environ.setdefault("MC_TCP_BIND_ADDRESS", s.hostname.rsplit(":", 1)[0])
        self._pool = ThreadPoolExecutor(s.workers, thread_name_prefix="dataplane")
        self._engine = await self._run(self._initialize)

    def _initialize(self) -> Any:
        s = self.settings
        engine = self._native()
        rc = engine.initialize(s.hostname, s.metadata_url, s.protocol, s.device)
        if rc != 0:
            raise DataPlaneError(
                f"Transfer Engine initialize({s.hostname!r}, {s.metadata_url!r}, {s.protocol!r}) "
                f"returned {rc} (metadata server unreachable, or the segment name is taken)"
            )
        return engine

    async def register(self, arena: Arena) -> None:
        rc = await self._run(lambda: int(self._live().register_memory(arena.base, arena.size)))
        if rc != 0:
            raise DataPlaneError(f"register_memory of {arena.size} bytes returned {rc}")
        self._arenas.append(arena)

    async def unregister(self, arena: Arena) -> None:
        if arena in self._arenas:
            self._arenas.remove(arena)
            await self._run(lambda: self._live().unregister_memory(arena.base))

    async def read(
        self,
        peer: str,
        local: Sequence[int],
        remote: Sequence[int],
        lengths: Sequence[int],
        timeout_s: float | None = None,
    ) -> Transfer:
        """Copy ``lengths[i]`` bytes at the peer's ``remote[i]`` to local ``local[i]``."""
        return await self._batch("read", peer, local, remote, lengths, timeout_s)

    async def write(
        self,
        peer: str,
        local: Sequence[int],
        remote: Sequence[int],
        lengths: Sequence[int],
        timeout_s: float | None = None,
    ) -> Transfer:
        """Copy ``lengths[i]`` bytes at local ``local[i]`` to the peer's ``remote[i]``."""
        return await self._batch("write", peer, local, remote, lengths, timeout_s)

    async def close(self) -> None:
        """Unregister every arena and destroy the engine (it deletes its keys in kvmeta)."""
        if self._engine is not None:
            for arena in list(self._arenas):
                await self.unregister(arena)
            await self._run(self._destroy)
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    def _destroy(self) -> None:
        self._engine = None  # the last reference: the destructor runs on this worker thread

    async def _batch(
        self,
        op: str,
        peer: str,
        local: Sequence[int],
        remote: Sequence[int],
        lengths: Sequence[int],
        timeout_s: float | None,
    ) -> Transfer:
        if not (len(local) == len(remote) == len(lengths)):
            raise ValueError("local, remote and lengths differ in length")
        if not lengths:
            return Transfer(0, 0.0)
        engine = self._live()
        call = engine.batch_transfer_sync_read if op == "read" else engine.batch_transfer_sync_write
        args = (peer, list(local), list(remote), list(lengths))
        nbytes = sum(lengths)
        timeout = self.settings.transfer_timeout_s if timeout_s is None else timeout_s
        t0 = self._clock()
        assert self._pool is not None
        fut = asyncio.get_running_loop().run_in_executor(self._pool, lambda: int(call(*args)))
        done, _ = await asyncio.wait({fut}, timeout=timeout)
        if not done:
            self.failures += 1
            raise TransferTimeout(
                f"{op} of {nbytes} bytes from {peer} not done after {timeout:g}s", fut
            )
        rc = fut.result()
        if rc != 0:
            self.failures += 1
            raise TransferError(f"{op} of {nbytes} bytes with {peer} returned {rc}")
        self.transfers += 1
        self.bytes_moved += nbytes
        return Transfer(nbytes, (self._clock() - t0) * 1000.0)

    def _live(self) -> Any:
        if self._engine is None:
            raise DataPlaneError("the data plane is not started")
        return self._engine

    async def _run(self, fn: Callable[[], T]) -> T:
        if self._pool is None:
            raise DataPlaneError("the data plane is not started")
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn)
