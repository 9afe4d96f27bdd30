"""API-key doubles: an in-memory key store (fakes over mocks) and a gate built on it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from services.scheduler.keys.cache import KeyCache
from services.scheduler.keys.counters import Counters, MemoryCounters
from services.scheduler.keys.gate import KeyGate
from services.scheduler.keys.model import ApiKey, hash_key, new_key

__all__ = ["FakeKeyStore", "fake_gate"]


class FakeKeyStore:
    """Keys by hash; ``fail`` makes every fetch raise; ``gate`` holds fetches until set;
    ``calls`` counts fetches."""

    def __init__(self) -> None:
        self.keys: dict[bytes, ApiKey] = {}
        self.fail = False
        self.calls = 0
        self.gate: asyncio.Event | None = None

    def add(self, tenant: str, slo_classes: Sequence[str] = (), **kw: object) -> str:
        """A new live key for ``tenant``; returns the secret."""
        secret, prefix = new_key()
        key = ApiKey(f"key_{len(self.keys)}", prefix, tenant, tuple(slo_classes), **kw)  # type: ignore[arg-type]
        self.keys[hash_key(secret)] = key
        return secret

    def revoke(self, secret: str) -> None:
        d = hash_key(secret)
        self.keys[d] = replace(self.keys[d], revoked_at=1.0)

    async def by_hash(self, digest: bytes) -> ApiKey | None:
        self.calls += 1
        if self.gate is not None:
            await self.gate.wait()
        if self.fail:
            raise OSError("connection refused")
        return self.keys.get(digest)


def fake_gate(
    store: FakeKeyStore,
    *,
    counters: Counters | None = None,
    clock: Callable[[], float] | None = None,
    wall: Callable[[], float] | None = None,
    ttl_s: float = 5.0,
    classes: Sequence[str] = ("interactive", "agent", "batch"),
    default_class: str = "agent",
    lease_fraction: float = 0.0,
) -> KeyGate:
    cache = KeyCache(store.by_hash, ttl_s=ttl_s, clock=clock or time.monotonic)
    return KeyGate(
        cache,
        counters or MemoryCounters(),
        classes=classes,
        default_class=default_class,
        wall=wall or time.time,
        lease_fraction=lease_fraction,
    )
