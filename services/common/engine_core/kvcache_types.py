"""The KV cache's value types (pure): its residency events, a block's bookkeeping and a
sequence's allocation. :mod:`services.common.engine_core.kvcache` re-exports the public ones."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

__all__ = ["Allocation", "KVEventKind", "KVEventRecord"]


class KVEventKind(Enum):
    STORED = "stored"
    REMOVED = "removed"
    ALL_CLEARED = "all_cleared"


@dataclass(frozen=True)
class KVEventRecord:
    """One residency change. STORED lists hashes parent first; ``parent_hash`` is the parent
    of ``block_hashes[0]`` (0 at the start of a sequence)."""

    kind: KVEventKind
    block_hashes: tuple[int, ...] = ()
    parent_hash: int = 0
    token_count: int = 0
    tenant: str = ""


@dataclass
class _Block:
    parent: int
    tenant: str
    slot: int
    refs: int = 0


@dataclass
class Allocation:
    """What a sequence holds. ``cached_blocks`` leading prompt blocks were found resident."""

    seq_id: str
    shared: list[int]
    private: int
    cached_blocks: int
    tenant: str = ""
    committed: list[int] = field(default_factory=list)
