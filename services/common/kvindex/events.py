"""KV event vocabulary of the index: kinds, tiers and the shape of one event.

Contract: an event is anything with ``kind``, ``tier``, ``block_hashes``, ``tenant`` and
``lora`` (``tideserve.v1.KVEvent`` satisfies :class:`EventLike`; :class:`BlockEvent` is the
frozen domain form). ``kind`` is STORED / REMOVED / ALL_CLEARED (other kinds are ignored);
``tier`` is 1..4 (GPU, CPU, SSD, remote) and 0 means GPU. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

__all__ = [
    "ALL_CLEARED",
    "DEFAULT_TIER",
    "REMOVED",
    "STORED",
    "TIERS",
    "BlockEvent",
    "EventLike",
]

STORED = 1
REMOVED = 2
ALL_CLEARED = 3
TIERS = (1, 2, 3, 4)
DEFAULT_TIER = 1


class EventLike(Protocol):
    """One KV event (``tideserve.v1.KVEvent`` satisfies this)."""

    @property
    def kind(self) -> int: ...
    @property
    def tier(self) -> int: ...
    @property
    def block_hashes(self) -> Sequence[int]: ...
    @property
    def tenant(self) -> str: ...
    @property
    def lora(self) -> str: ...


@dataclass(frozen=True)
class BlockEvent:
    """Domain KV event; ``kind`` is STORED / REMOVED / ALL_CLEARED, ``tier`` 1..4 (0 = GPU)."""

    kind: int
    block_hashes: Sequence[int] = ()
    tier: int = DEFAULT_TIER
    tenant: str = ""
    lora: str = ""
