"""The one pure KV-block index: kvmeta's prefix index and the scheduler's local replica are
both built on it.

Modules, each pure (no I/O, no asyncio, no wall clock: time is passed in):

- :mod:`.events` — event kinds and tiers, :class:`EventLike` / :class:`BlockEvent`;
- :mod:`.sequencer` — the per-instance epoch/seq contract with gap detection
  (:func:`sequence`: :class:`SeqState` in, :class:`Step` out);
- :mod:`.slots` — instance slots and holder values (the storage), O(1) forgetting,
  :func:`compact`;
- :mod:`.match` — the chain match (:func:`match_chain` → :class:`ChainMatch`);
- :mod:`.index` — :class:`ChainIndex`, one deployment's index over the three above;
- :mod:`.resync` — which stale instances to ask for a full state, and when
  (:func:`plan_resyncs` with a :class:`ResyncPolicy`).
"""

from services.common.kvindex.events import (
    ALL_CLEARED,
    DEFAULT_TIER,
    REMOVED,
    STORED,
    TIERS,
    BlockEvent,
    EventLike,
)
from services.common.kvindex.index import ChainIndex, InstanceInfo
from services.common.kvindex.match import NO_MATCH, ChainMatch, match_chain
from services.common.kvindex.resync import (
    Outstanding,
    ResyncPlan,
    ResyncPolicy,
    StaleInstance,
    plan_resyncs,
)
from services.common.kvindex.sequencer import SeqState, Step, Verdict, sequence
from services.common.kvindex.slots import MAX_SLOTS, IndexState

__all__ = [
    "ALL_CLEARED",
    "DEFAULT_TIER",
    "MAX_SLOTS",
    "NO_MATCH",
    "REMOVED",
    "STORED",
    "TIERS",
    "BlockEvent",
    "ChainIndex",
    "ChainMatch",
    "EventLike",
    "IndexState",
    "InstanceInfo",
    "Outstanding",
    "ResyncPlan",
    "ResyncPolicy",
    "SeqState",
    "StaleInstance",
    "Step",
    "Verdict",
    "match_chain",
    "plan_resyncs",
    "sequence",
]
