"""Translation to tideserve.v1.KVEvent and the bridge's epoch / seq / replay state machine."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from tideserve.v1 import common_pb2, events_pb2

from services.kvbridge.core import BridgeCore
from services.kvbridge.translate import (
    TranslateConfig,
    TranslateStats,
    tier_of,
    translate_events,
)
from services.kvbridge.wire import (
    AllCleared,
    BlockRemoved,
    BlockStored,
    EngineBatch,
    UnknownEvent,
)

CFG = TranslateConfig(deployment="llama", instance_id="p0", tenant="acme", block_size=16)
K = events_pb2.KVEvent


@pytest.mark.parametrize(
    ("medium", "tier"),
    [
        (None, common_pb2.TIER_GPU),
        ("", common_pb2.TIER_GPU),
        ("GPU", common_pb2.TIER_GPU),
        ("gpu", common_pb2.TIER_GPU),
        ("CPU", common_pb2.TIER_CPU),
        ("CPU_PINNED", common_pb2.TIER_CPU),
        ("cpu_offload", common_pb2.TIER_CPU),
        ("DISK", common_pb2.TIER_SSD),
        ("ssd", common_pb2.TIER_SSD),
        ("REMOTE", common_pb2.TIER_REMOTE),
        ("tape", None),
    ],
    ids=[
        "none",
        "empty",
        "gpu",
        "gpu-lower",
        "cpu",
        "sglang-cpu-pinned",
        "cpu-prefix",
        "disk",
        "ssd",
        "remote",
        "unknown",
    ],
)
def test_tier_of(medium: str | None, tier: int | None) -> None:
    assert tier_of(medium) == tier


def stored(
    *hashes: int, parent: int | None = None, medium: str | None = "GPU", **kw: object
) -> BlockStored:
    fields: dict[str, object] = dict(
        block_hashes=hashes,
        parent_hash=parent,
        token_count=16 * len(hashes),
        block_size=16,
        lora="",
        medium=medium,
        group_idx=None,
    )
    fields.update(kw)
    return BlockStored(**fields)  # type: ignore[arg-type]


def test_translate_fields() -> None:
    batch = EngineBatch(
        1.0,
        (
            stored(1, 2, parent=9, lora="sql", token_count=30, block_size=8),
            BlockRemoved((3,), "CPU", None),
            AllCleared(),
        ),
        None,
    )
    events, block_size = translate_events(batch, CFG)
    assert block_size == 8
    assert events == [
        K(
            kind=K.KIND_BLOCK_STORED,
            tier=common_pb2.TIER_GPU,
            block_hashes=[1, 2],
            parent_hash=9,
            token_count=30,
            tenant="acme",
            lora="sql",
        ),
        K(kind=K.KIND_BLOCK_REMOVED, tier=common_pb2.TIER_CPU, block_hashes=[3], tenant="acme"),
        K(kind=K.KIND_ALL_CLEARED),
    ]


@pytest.mark.parametrize(
    ("event", "kv_group", "kept", "counter"),
    [
        (stored(1, medium="tape"), 0, False, "unknown_medium"),
        (BlockRemoved((1,), "tape", None), 0, False, "unknown_medium"),
        (stored(1, group_idx=1), 0, False, "other_group"),
        (stored(1, group_idx=1), None, True, "events"),
        (stored(1, group_idx=0), 0, True, "events"),
        (BlockRemoved((1,), None, 2), 0, False, "other_group"),
        (UnknownEvent("BlockPinned"), 0, False, "unknown_tag"),
    ],
    ids=[
        "unknown-medium-stored",
        "unknown-medium-removed",
        "other-group",
        "all-groups",
        "group-0",
        "removed-other-group",
        "unknown-tag",
    ],
)
def test_translate_filters(event: object, kv_group: int | None, kept: bool, counter: str) -> None:
    cfg = TranslateConfig("d", "i", kv_group=kv_group, block_size=4)
    stats = TranslateStats()
    events, block_size = translate_events(EngineBatch(1.0, (event,), None), cfg, stats)  # type: ignore[arg-type]
    assert bool(events) is kept
    assert getattr(stats, counter) == 1
    assert block_size == (16 if kept else 4)


def test_parent_none_is_zero() -> None:
    events, _ = translate_events(EngineBatch(1.0, (stored(5),), None), CFG)
    assert events[0].parent_hash == 0


# --------------------------------------------------------------------------- state machine


def batch(h: int, ts: float = 1_700_000_000.25) -> EngineBatch:
    return EngineBatch(ts, (stored(h),), None)


@dataclass
class Out:
    """What the core published for one input: (epoch, seq, first block hash) per batch."""

    published: list[tuple[int, int, int]]
    replay_from: int | None = None


def _first_hash(m: events_pb2.KVEventBatch) -> int:
    """The batch's first block hash; 0 for an epoch reset (a batch without events)."""
    return m.events[0].block_hashes[0] if m.events else 0


def run(core: BridgeCore, steps: list[tuple[str, int, int | None, int]]) -> list[Out]:
    """steps: (kind, engine seq, block hash or None = undecodable, now_ms); kind
    live|replay|done|disconnect|connect (``connect`` reports the probe's start as replay_from)."""
    outs = []
    for kind, seq, h, now in steps:
        b = None if h is None else batch(h)
        if kind == "disconnect":
            core.on_disconnected()
            msgs, replay = [], None
        elif kind == "connect":
            step = core.on_connected(now)
            msgs, replay = step.batches, step.replay_from
        elif kind == "live":
            step = core.on_live(seq, b, now)
            msgs, replay = step.batches, step.replay_from
        elif kind == "replay":
            msgs, replay = core.on_replayed(seq, b, now), None
        else:
            msgs, replay = core.replay_done(now), None
        outs.append(Out([(m.epoch, m.seq, _first_hash(m)) for m in msgs], replay))
    return outs


SEQUENCE_CASES = [
    (
        False,
        [("live", 0, 10, 1), ("live", 1, 11, 2), ("live", 2, 12, 3)],
        [Out([(100, 1, 10)]), Out([(100, 2, 11)]), Out([(100, 3, 12)])],
        dict(in_order=3, new_epochs=0),
    ),
    (
        False,
        [("live", 57, 10, 1), ("live", 58, 11, 2)],
        [Out([(100, 1, 10)]), Out([(100, 2, 11)])],
        dict(in_order=2),
    ),
    (
        False,
        [("live", 0, 10, 1), ("live", 1, 11, 2), ("live", 0, 20, 500)],
        [Out([(100, 1, 10)]), Out([(100, 2, 11)]), Out([(500, 1, 20)])],
        dict(restarts=1, new_epochs=1),
    ),
    (
        False,
        [("live", 0, 10, 1), ("live", 3, 13, 50)],
        [Out([(100, 1, 10)]), Out([(101, 1, 13)])],
        dict(gaps=1, new_epochs=1),
    ),
    (
        True,
        [
            ("live", 0, 10, 1),
            ("live", 1, 11, 2),
            ("live", 4, 14, 3),
            ("live", 5, 15, 4),
            ("replay", 1, 11, 5),
            ("replay", 2, 12, 5),
            ("replay", 3, 13, 5),
            ("replay", 4, 14, 5),
            ("done", 0, None, 6),
        ],
        [
            Out([(100, 1, 10)]),
            Out([(100, 2, 11)]),
            Out([], replay_from=2),
            Out([]),
            Out([]),
            Out([(100, 3, 12)]),
            Out([(100, 4, 13)]),
            Out([(100, 5, 14)]),
            Out([(100, 6, 15)]),
        ],
        dict(replays=1, duplicates=2, gaps=0, new_epochs=0),
    ),
    (
        True,
        [
            ("live", 0, 10, 1),
            ("live", 5, 15, 2),
            ("replay", 3, 13, 300),
            ("replay", 4, 14, 300),
            ("done", 0, None, 301),
        ],
        [
            Out([(100, 1, 10)]),
            Out([], replay_from=1),
            Out([(300, 1, 13)]),
            Out([(300, 2, 14)]),
            Out([(300, 3, 15)]),
        ],
        dict(gaps=1, new_epochs=1),
    ),
    (
        True,
        [("live", 0, 10, 1), ("live", 2, 12, 2), ("done", 0, None, 400)],
        [Out([(100, 1, 10)]), Out([], replay_from=1), Out([(400, 1, 12)])],
        dict(gaps=1, new_epochs=1, replays=1),
    ),
    (
        True,
        [
            ("live", 0, 10, 1),
            ("live", 2, 12, 2),
            ("replay", 1, 11, 3),
            ("replay", 2, 12, 3),
            ("replay", 3, 13, 3),
            ("done", 0, None, 4),
            ("live", 3, 13, 5),
            ("live", 4, 14, 6),
            ("live", 0, 20, 700),
        ],
        [
            Out([(100, 1, 10)]),
            Out([], replay_from=1),
            Out([(100, 2, 11)]),
            Out([(100, 3, 12)]),
            Out([(100, 4, 13)]),
            Out([]),
            Out([]),
            Out([(100, 5, 14)]),
            Out([(700, 1, 20)]),
        ],
        dict(duplicates=2, restarts=1, new_epochs=1),
    ),
    (
        False,
        [("live", 0, 10, 1), ("live", 1, None, 2), ("live", 2, 12, 200)],
        [Out([(100, 1, 10)]), Out([]), Out([(200, 1, 12)])],
        dict(lost=1, new_epochs=1, gaps=0),
    ),
    (
        False,
        [("live", 0, 10, 1), ("live", 1, 11, 50), ("live", 0, 20, 50), ("live", 0, 30, 50)],
        [Out([(100, 1, 10)]), Out([(100, 2, 11)]), Out([(101, 1, 20)]), Out([(102, 1, 30)])],
        dict(restarts=2, new_epochs=2),
    ),
]


SEQUENCE_CASES += [
    (  # the engine restarted and has published nothing yet: its old blocks go at once
        True,
        [
            ("live", 0, 10, 1),
            ("live", 1, 11, 2),
            ("disconnect", 0, None, 3),
            ("connect", 0, None, 900),
            ("done", 0, None, 901),
            ("live", 0, 20, 950),
        ],
        [
            Out([(100, 1, 10)]),
            Out([(100, 2, 11)]),
            Out([]),
            Out([], replay_from=0),
            Out([(901, 1, 0)]),
            Out([(901, 2, 20)]),
        ],
        dict(disconnects=1, restarts=1, new_epochs=1, replays=1),
    ),
    (  # restarted and already published: the probe's batches start the new epoch
        True,
        [
            ("live", 0, 10, 1),
            ("live", 1, 11, 2),
            ("live", 2, 12, 3),
            ("disconnect", 0, None, 4),
            ("connect", 0, None, 900),
            ("replay", 0, 20, 900),
            ("replay", 1, 21, 900),
            ("done", 0, None, 901),
            ("live", 2, 22, 950),
        ],
        [
            Out([(100, 1, 10)]),
            Out([(100, 2, 11)]),
            Out([(100, 3, 12)]),
            Out([]),
            Out([], replay_from=0),
            Out([]),
            Out([]),
            Out([(901, 1, 0), (901, 2, 20), (901, 3, 21)]),
            Out([(901, 4, 22)]),
        ],
        dict(disconnects=1, restarts=1, new_epochs=1),
    ),
    (  # a network blip: the same process still holds our history, nothing is reset
        True,
        [
            ("live", 0, 10, 1),
            ("live", 1, 11, 2),
            ("disconnect", 0, None, 3),
            ("connect", 0, None, 900),
            ("replay", 0, 10, 900),
            ("replay", 1, 11, 900),
            ("replay", 2, 12, 900),
            ("done", 0, None, 901),
            ("live", 3, 13, 950),
        ],
        [
            Out([(100, 1, 10)]),
            Out([(100, 2, 11)]),
            Out([]),
            Out([], replay_from=0),
            Out([]),
            Out([]),
            Out([]),
            Out([(100, 3, 12)]),
            Out([(100, 4, 13)]),
        ],
        dict(disconnects=1, restarts=0, new_epochs=0, duplicates=2),
    ),
    (  # without a replay socket a reconnect cannot be told from a restart: new epoch
        False,
        [
            ("live", 0, 10, 1),
            ("disconnect", 0, None, 2),
            ("connect", 0, None, 600),
            ("live", 1, 11, 601),
        ],
        [Out([(100, 1, 10)]), Out([]), Out([(600, 1, 0)]), Out([(600, 2, 11)])],
        dict(disconnects=1, restarts=1, new_epochs=1),
    ),
    (  # the first connection is not a reconnect
        False,
        [("connect", 0, None, 1), ("live", 0, 10, 2)],
        [Out([]), Out([(100, 1, 10)])],
        dict(disconnects=0, new_epochs=0),
    ),
]


@pytest.mark.parametrize(
    ("replay", "steps", "expected", "counters"),
    SEQUENCE_CASES,
    ids=[
        "in-order",
        "joined-late",
        "engine-restart-new-epoch",
        "gap-without-replay-new-epoch",
        "gap-filled-by-replay",
        "gap-replay-buffer-rolled-over",
        "gap-replay-timed-out",
        "live-already-replayed-is-duplicate-not-restart",
        "undecodable-new-epoch",
        "epoch-increases-when-clock-stalls",
        "reconnect-restarted-engine-empty",
        "reconnect-restarted-engine-published",
        "reconnect-same-engine",
        "reconnect-without-replay-new-epoch",
        "first-connect-is-not-reconnect",
    ],
)
def test_sequencing(
    replay: bool,
    steps: list[tuple[str, int, int | None, int]],
    expected: list[Out],
    counters: dict[str, int],
) -> None:
    core = BridgeCore(CFG, replay=replay, now_ms=100)
    assert run(core, steps) == expected
    for name, value in counters.items():
        assert getattr(core.stats, name) == value, name


def test_start_replays_from_zero_and_holds_live() -> None:
    core = BridgeCore(CFG, replay=True, now_ms=100)
    assert core.start() == 0
    assert core.on_live(7, batch(17), 1).batches == []  # held
    assert [m.seq for m in core.on_replayed(5, batch(15), 2)] == [1]
    assert [m.seq for m in core.on_replayed(6, batch(16), 2)] == [1 + 1]
    out = core.replay_done(3)
    assert [(m.epoch, m.seq, m.events[0].block_hashes[0]) for m in out] == [(100, 3, 17)]


def test_start_without_replay() -> None:
    assert BridgeCore(CFG, replay=False, now_ms=1).start() is None


def test_empty_after_filtering_uses_no_seq() -> None:
    core = BridgeCore(CFG, replay=False, now_ms=100)
    empty = EngineBatch(1.0, (UnknownEvent("X"),), None)
    assert core.on_live(0, empty, 1).batches == []
    out = core.on_live(1, batch(11), 2).batches
    assert [(m.seq, m.deployment, m.instance_id, m.block_size) for m in out] == [
        (1, "llama", "p0", 16)
    ]
    assert core.stats.filtered_empty == 1


@pytest.mark.parametrize(
    ("ts", "now_ms", "ts_ms"),
    [(1_700_000_000.25, 5, 1_700_000_000_250), (0.0, 5, 5), (-1.0, 6, 6)],
    ids=["engine-ts", "zero-ts-uses-now", "negative-ts-uses-now"],
)
def test_ts_ms(ts: float, now_ms: int, ts_ms: int) -> None:
    core = BridgeCore(CFG, replay=False, now_ms=1)
    out = core.on_live(0, batch(1, ts=ts), now_ms).batches
    assert out[0].ts_ms == ts_ms


def test_mark_lost_starts_new_epoch() -> None:
    core = BridgeCore(CFG, replay=False, now_ms=100)
    core.on_live(0, batch(1), 1)
    core.mark_lost()
    out = core.on_live(1, batch(2), 900).batches
    assert [(m.epoch, m.seq) for m in out] == [(900, 1)]


def test_live_held_during_start_replay_is_duplicate_not_restart() -> None:
    core = BridgeCore(CFG, replay=True, now_ms=100)
    assert core.start() == 0
    assert core.on_live(0, batch(10), 1).batches == []  # held while replaying
    assert core.on_live(1, batch(11), 1).batches == []
    assert [m.seq for m in core.on_replayed(0, batch(10), 2)] == [1]
    assert [m.seq for m in core.on_replayed(1, batch(11), 2)] == [2]
    assert core.replay_done(3) == []
    assert (core.stats.restarts, core.stats.duplicates, core.epoch) == (0, 2, 100)
