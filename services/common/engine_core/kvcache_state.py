"""The resident set of a :class:`~services.common.engine_core.kvcache.KVCache` as KV events (pure): the
answer to a resync request, so that drained events followed by it reproduce the cache."""

from __future__ import annotations

from collections.abc import Mapping

from services.common.engine_core.kvcache_types import KVEventKind, KVEventRecord, _Block

__all__ = ["full_state"]


def full_state(blocks: Mapping[int, _Block], block_size: int) -> list[KVEventRecord]:
    """ALL_CLEARED, then STORED runs covering every cached block of ``blocks`` exactly once.
    A run is a chain (each block the parent of the next, one tenant); a run starts at a block
    whose parent is not resident (``parent_hash`` = its recorded parent) or branches off a
    block of an earlier run, so parents precede children."""
    children: dict[int, list[int]] = {}
    starts: list[int] = []
    for h, b in blocks.items():
        parent = blocks.get(b.parent) if b.parent else None
        if parent is not None and parent.tenant == b.tenant:
            children.setdefault(b.parent, []).append(h)
        else:
            starts.append(h)
    out = [KVEventRecord(KVEventKind.ALL_CLEARED)]
    stack = list(reversed(starts))
    while stack:
        h = stack.pop()
        first = blocks[h]
        run = [h]
        kids = children.get(h)
        while kids:
            stack.extend(reversed(kids[1:]))  # branches: later runs, parent already out
            h = kids[0]
            run.append(h)
            kids = children.get(h)
        out.append(
            KVEventRecord(
                KVEventKind.STORED, tuple(run), first.parent, len(run) * block_size, first.tenant
            )
        )
    return out
