"""The bridge's sequencing state machine (pure: time is a parameter, no I/O).

Input: engine batches with the engine's ZMQ sequence numbers, from the live PUB stream or from
a replay. Output: ``tideserve.v1.KVEventBatch`` messages whose ``(epoch, seq)`` follow the
Tideserve contract (``seq`` contiguous from 1 within an epoch; a new epoch resets the instance
in the index).

Rules:

- The first epoch is the bridge's start time (ms). Each new epoch is ``max(now_ms, epoch+1)``
  (strictly increasing even if the clock stalls).
- Live seq == last+1 (or the first seq seen): in order, published.
- Live seq <= the last seq seen LIVE: the engine restarted (its counter starts again at 0;
  PUB never repeats a seq) → new epoch, published. The engine's cache is empty after a
  restart, so the reset is exact. A live seq above the last live one but already delivered by
  a replay is a duplicate (skipped).
- Live seq > last+1: a gap (PUB dropped messages, e.g. high-water mark or reconnect). With a
  replay endpoint, the core asks the shell to replay from last+1 (``Step.replay_from``);
  live batches arriving meanwhile are held and applied after :meth:`BridgeCore.replay_done`.
  A gap that replay does not fill (no replay socket, the engine's buffer rolled over, the
  replay timed out) → new epoch: the index forgets the instance and rebuilds it from the
  following events. Never ALL_CLEARED: that would claim the engine flushed its cache.
- An undecodable batch (dead-lettered by the shell) lost its events: the next decodable batch
  starts a new epoch (a replay would return the same bytes).
- Replayed seq <= last: duplicate, skipped. Batches whose events were all filtered out are not
  published and use no seq.
- :meth:`BridgeCore.start` asks for an initial replay from seq 0 when replay is enabled, so a
  (re)started bridge catches up with whatever the engine still buffers.
- The publisher's connection dropped and came back (:meth:`BridgeCore.on_disconnected`, then
  :meth:`BridgeCore.on_connected`): the engine may have restarted without publishing yet, so
  its cache is empty while the index still holds its old blocks. With a replay endpoint the
  core asks for a probe replay from seq 0: the engine that went on holds a batch at or after
  the last seq seen; a restarted one holds only its new batches, all of lower seq (or none)
  → new epoch, and the probe's batches are applied as the new process's first ones. Without
  a replay endpoint a restart cannot be told from a network blip → new epoch (the index then
  under-reports until blocks are stored again; it never claims blocks the engine lost).
  A new epoch found this way is published at once as a batch without events (seq 1), which
  resets the instance in the index before the engine stores anything.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from tideserve.v1 import events_pb2

from services.kvbridge.translate import TranslateConfig, TranslateStats, translate_events
from services.kvbridge.wire import EngineBatch

__all__ = ["BridgeCore", "CoreStats", "Step"]


@dataclass(slots=True)
class Step:
    """What the shell must do after a live batch: publish ``batches`` (in order), then, when
    ``replay_from`` is set, replay from that engine seq and call ``replay_done``."""

    batches: list[events_pb2.KVEventBatch] = field(default_factory=list)
    replay_from: int | None = None


@dataclass(slots=True)
class CoreStats:
    """Counters since the core was created."""

    published: int = 0
    in_order: int = 0
    duplicates: int = 0
    gaps: int = 0
    restarts: int = 0
    lost: int = 0
    new_epochs: int = 0
    replays: int = 0
    filtered_empty: int = 0
    disconnects: int = 0


class BridgeCore:
    """Sequencing and translation for one engine publisher (one Tideserve instance)."""

    def __init__(self, cfg: TranslateConfig, *, replay: bool, now_ms: int) -> None:
        self.cfg = cfg
        self.replay_enabled = replay
        self.epoch = now_ms
        self.seq = 0
        self.last_engine_seq: int | None = None
        # Highest seq seen on the live stream: a live seq at or below it is a restart, one
        # above it but at or below last_engine_seq was already delivered by a replay.
        self.last_live_seq: int | None = None
        self.replaying = False
        self.stats = CoreStats()
        self.translate_stats = TranslateStats()
        self._pending: list[tuple[int, EngineBatch | None]] = []
        self._lost = False
        self._disconnected = False
        # During a probe replay after a reconnect: the replayed batches, held until the end
        # of the replay tells whether they continue the history or start a new process's.
        self._probe: list[tuple[int, EngineBatch | None]] | None = None

    # ------------------------------------------------------------------ inputs

    def start(self) -> int | None:
        """Engine seq to replay from before live traffic (0), or None without replay."""
        if not self.replay_enabled:
            return None
        self.replaying = True
        self.stats.replays += 1
        return 0

    def on_live(self, engine_seq: int, batch: EngineBatch | None, now_ms: int) -> Step:
        """A live PUB batch (``batch=None``: undecodable, already dead-lettered)."""
        if self.replaying:
            self._pending.append((engine_seq, batch))
            return Step()
        step = Step()
        step.replay_from = self._live(engine_seq, batch, now_ms, step.batches, allow_replay=True)
        return step

    def on_disconnected(self) -> None:
        """The connection to the engine's publisher dropped."""
        self.stats.disconnects += 1
        self._disconnected = True

    def on_connected(self, now_ms: int) -> Step:
        """The publisher is connected again: publish ``batches`` (an epoch reset when there is
        no replay to tell a restart from a blip) or probe-replay from ``replay_from``."""
        step = Step()
        if not self._disconnected or self.replaying:
            return step
        self._disconnected = False
        if self.last_engine_seq is None:
            step.replay_from = self.start()
        elif not self.replay_enabled:
            self._restarted(now_ms, step.batches)
        else:
            self._probe = []
            step.replay_from = self.start()
        return step

    def on_replayed(
        self, engine_seq: int, batch: EngineBatch | None, now_ms: int
    ) -> list[events_pb2.KVEventBatch]:
        """A batch answered by the replay socket (only while :attr:`replaying`)."""
        if self._probe is not None:
            self._probe.append((engine_seq, batch))
            return []
        out: list[events_pb2.KVEventBatch] = []
        last = self.last_engine_seq
        if last is not None and engine_seq <= last:
            self.stats.duplicates += 1
        elif last is None or engine_seq == last + 1:
            self._accept(engine_seq, batch, now_ms, out)
        else:  # the engine's buffer no longer holds last+1 ...
            self.stats.gaps += 1
            self._new_epoch(now_ms)
            self._accept(engine_seq, batch, now_ms, out)
        return out

    def replay_done(self, now_ms: int) -> list[events_pb2.KVEventBatch]:
        """The replay ended (end marker, timeout or error): apply the held live batches."""
        self.replaying = False
        out = self._probe_done(now_ms)
        pending, self._pending = self._pending, []
        for engine_seq, batch in pending:
            self._live(engine_seq, batch, now_ms, out, allow_replay=False)
        return out

    def mark_lost(self) -> None:
        """A message without a usable seq was dropped: start a new epoch at the next batch."""
        self.stats.lost += 1
        self._lost = True

    # ------------------------------------------------------------------ internals

    def _probe_done(self, now_ms: int) -> list[events_pb2.KVEventBatch]:
        """Resolve a probe replay: the same process (it still holds a seq at or after the
        last one seen) goes on as after any replay; otherwise the engine restarted."""
        probe, self._probe = self._probe, None
        out: list[events_pb2.KVEventBatch] = []
        if probe is None:
            return out
        last = self.last_engine_seq
        if last is not None and not any(seq >= last for seq, _ in probe):
            self._restarted(now_ms, out)
        for engine_seq, batch in probe:
            out += self.on_replayed(engine_seq, batch, now_ms)
        return out

    def _restarted(self, now_ms: int, out: list[events_pb2.KVEventBatch]) -> None:
        """A new epoch, published at once as an empty batch (the index resets on it)."""
        self.stats.restarts += 1
        self._new_epoch(now_ms)
        self.last_engine_seq = None
        self.last_live_seq = None
        self.seq = 1
        out.append(self._batch(now_ms))
        self.stats.published += 1

    def _live(
        self,
        engine_seq: int,
        batch: EngineBatch | None,
        now_ms: int,
        out: list[events_pb2.KVEventBatch],
        *,
        allow_replay: bool,
    ) -> int | None:
        last, last_live = self.last_engine_seq, self.last_live_seq
        if last is None or engine_seq == last + 1:
            self.stats.in_order += 1
        elif engine_seq <= last:
            if last_live is None or engine_seq > last_live:
                # already delivered by a replay (the first live batches after the start's
                # replay come from the process that answered it)
                self.stats.duplicates += 1
                self.last_live_seq = engine_seq
                return None
            self.stats.restarts += 1
            self._new_epoch(now_ms)
        elif allow_replay and self.replay_enabled:
            self.replaying = True
            self.stats.replays += 1
            self._pending.append((engine_seq, batch))
            return last + 1
        else:
            self.stats.gaps += 1
            self._new_epoch(now_ms)
        self.last_live_seq = engine_seq
        self._accept(engine_seq, batch, now_ms, out)
        return None

    def _accept(
        self,
        engine_seq: int,
        batch: EngineBatch | None,
        now_ms: int,
        out: list[events_pb2.KVEventBatch],
    ) -> None:
        self.last_engine_seq = engine_seq
        if batch is None:
            self.stats.lost += 1
            self._lost = True
            return
        if self._lost:
            self._lost = False
            self._new_epoch(now_ms)
        events, block_size = translate_events(batch, self.cfg, self.translate_stats)
        if not events:
            self.stats.filtered_empty += 1
            return
        self.seq += 1
        ts_ms = int(batch.ts * 1000) if math.isfinite(batch.ts) and batch.ts > 0 else now_ms
        out.append(self._batch(ts_ms, events, block_size))
        self.stats.published += 1

    def _batch(
        self, ts_ms: int, events: list[events_pb2.KVEvent] | None = None, block_size: int = 0
    ) -> events_pb2.KVEventBatch:
        """A batch of this instance at the current (epoch, seq)."""
        return events_pb2.KVEventBatch(
            deployment=self.cfg.deployment,
            instance_id=self.cfg.instance_id,
            epoch=self.epoch,
            seq=self.seq,
            ts_ms=ts_ms,
            events=events,
            block_size=block_size,
        )

    def _new_epoch(self, now_ms: int) -> None:
        self.epoch = max(now_ms, self.epoch + 1)
        self.seq = 0
        self._lost = False
        self.stats.new_epochs += 1
