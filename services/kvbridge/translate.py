"""Engine KV events → ``tideserve.v1.KVEvent`` (pure).

Mapping (one engine event → at most one Tideserve event):

- ``BlockStored`` → ``KIND_BLOCK_STORED`` with the folded hashes (parent first),
  ``parent_hash`` (0 when the engine sent none), ``token_count`` = number of token ids
  (or ``block_size * blocks`` when the engine sent none), ``lora`` = LoRA name, else LoRA id
  as text, else "".
- ``BlockRemoved`` → ``KIND_BLOCK_REMOVED``; ``AllBlocksCleared`` → ``KIND_ALL_CLEARED``.
- ``medium`` → tier via :func:`tier_of` (absent = GPU). An event whose medium is unknown is
  skipped (its stores and removes are skipped alike, so the index stays consistent) and
  counted.
- ``group_idx`` (vLLM hybrid models: one KV cache group per attention type): only events of
  ``kv_group`` (and events without a group) are kept; ``kv_group=None`` keeps every group.
- unknown event tags are skipped and counted.

Block hashes are the ENGINE's hashes, not ``services.common.tokens.block_hashes``: see
``services/kvbridge/README.md`` for what a router must compute to match them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tideserve.v1 import common_pb2, events_pb2

from services.kvbridge.wire import (
    AllCleared,
    BlockRemoved,
    BlockStored,
    EngineBatch,
    UnknownEvent,
)

__all__ = ["TranslateConfig", "TranslateStats", "tier_of", "translate_events"]

_GPU, _CPU, _SSD, _REMOTE = (
    common_pb2.TIER_GPU,
    common_pb2.TIER_CPU,
    common_pb2.TIER_SSD,
    common_pb2.TIER_REMOTE,
)
# Medium names seen in vLLM ("GPU", offloading connectors: "CPU"), SGLang ("GPU",
# "CPU_PINNED" for HiCache host memory) and common storage backends. Upper-cased keys.
MEDIUM_TIERS: dict[str, int] = {
    "GPU": _GPU,
    "CUDA": _GPU,
    "HBM": _GPU,
    "DEVICE": _GPU,
    "CPU": _CPU,
    "CPU_PINNED": _CPU,
    "HOST": _CPU,
    "DRAM": _CPU,
    "DISK": _SSD,
    "LOCAL_DISK": _SSD,
    "SSD": _SSD,
    "NVME": _SSD,
    "FILE": _SSD,
    "REMOTE": _REMOTE,
    "OBJECT": _REMOTE,
    "S3": _REMOTE,
    "MOONCAKE": _REMOTE,
}


def tier_of(medium: str | None) -> int | None:
    """The Tier of an engine medium name; None when unknown. ``None`` medium = GPU."""
    if medium is None or not medium.strip():
        return _GPU
    key = medium.strip().upper()
    if key in MEDIUM_TIERS:
        return MEDIUM_TIERS[key]
    if key.startswith("CPU"):
        return _CPU
    return None


@dataclass(frozen=True, slots=True)
class TranslateConfig:
    """Who the events are about, and which of them to keep."""

    deployment: str
    instance_id: str
    tenant: str = ""
    # vLLM KV cache group to index (0 = the first, full-attention group); None = all.
    kv_group: int | None = 0
    # Block size announced when a batch carries no BlockStored (0 = unknown).
    block_size: int = 0


@dataclass(slots=True)
class TranslateStats:
    """Counters of what translation skipped (cumulative when the same object is reused)."""

    events: int = 0
    unknown_tag: int = 0
    unknown_medium: int = 0
    other_group: int = 0
    unknown_mediums: set[str] = field(default_factory=set)


def translate_events(
    batch: EngineBatch, cfg: TranslateConfig, stats: TranslateStats | None = None
) -> tuple[list[events_pb2.KVEvent], int]:
    """Tideserve events of one engine batch, and the block size it announces.

    Never raises for well-formed :class:`EngineBatch` input; skipped events are counted in
    ``stats``. The block size is the first non-zero ``block_size`` of a stored event, else
    ``cfg.block_size``.
    """
    st = stats if stats is not None else TranslateStats()
    out: list[events_pb2.KVEvent] = []
    block_size = 0
    for ev in batch.events:
        if isinstance(ev, UnknownEvent):
            st.unknown_tag += 1
            continue
        if isinstance(ev, AllCleared):
            out.append(events_pb2.KVEvent(kind=events_pb2.KVEvent.KIND_ALL_CLEARED))
            st.events += 1
            continue
        if cfg.kv_group is not None and ev.group_idx not in (None, cfg.kv_group):
            st.other_group += 1
            continue
        tier = tier_of(ev.medium)
        if tier is None:
            st.unknown_medium += 1
            st.unknown_mediums.add(str(ev.medium))
            continue
        if isinstance(ev, BlockStored):
            if not block_size and ev.block_size > 0:
                block_size = ev.block_size
            out.append(_stored(ev, tier, cfg.tenant))
        elif isinstance(ev, BlockRemoved):
            out.append(
                events_pb2.KVEvent(
                    kind=events_pb2.KVEvent.KIND_BLOCK_REMOVED,
                    tier=tier,  # type: ignore[arg-type]
                    block_hashes=ev.block_hashes,
                    tenant=cfg.tenant,
                )
            )
        st.events += 1
    return out, block_size or cfg.block_size


def _stored(ev: BlockStored, tier: int, tenant: str) -> events_pb2.KVEvent:
    return events_pb2.KVEvent(
        kind=events_pb2.KVEvent.KIND_BLOCK_STORED,
        tier=tier,  # type: ignore[arg-type]
        block_hashes=ev.block_hashes,
        parent_hash=ev.parent_hash or 0,
        token_count=min(ev.token_count, 2**31 - 1),
        tenant=tenant,
        lora=ev.lora,
    )
