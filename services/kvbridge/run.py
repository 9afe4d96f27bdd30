"""The bridge process shell: engine ZMQ publisher → :class:`BridgeCore` → Redis stream.

Thin: it receives frames, decodes them (:mod:`wire`), lets the pure core sequence and
translate them, publishes the resulting ``KVEventBatch`` messages with
:class:`services.common.streams.StreamProducer`, and talks to the engine's replay socket when
the core asks, and reports the SUB socket's disconnects and reconnects to the core (a
restarted engine is found before it publishes anything). Undecodable messages are logged and copied as ``tideserve.v1.DeadLetter`` to
``{stream}:dead``; the bridge goes on. A Redis outage is retried with backoff (the engine's
messages wait in the ZMQ receive queue meanwhile).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import redis.asyncio as aioredis
import zmq
import zmq.asyncio
from redis.exceptions import RedisError
from tideserve.v1 import events_pb2
from zmq.utils.monitor import parse_monitor_message

from services.common.streams import StreamProducer, dead_letter_stream, stream_name
from services.common.tasks import pause
from services.kvbridge.core import BridgeCore
from services.kvbridge.settings import KVBridgeSettings
from services.kvbridge.translate import TranslateConfig
from services.kvbridge.wire import (
    END_SEQ,
    EngineBatch,
    WireError,
    decode_batch,
    decode_live,
    decode_replay,
    encode_replay_request,
)

__all__ = ["BridgeStats", "KVBridge"]

log = logging.getLogger(__name__)

_POLL_MS = 200
_RCV_HWM = 100_000


@dataclass(slots=True)
class BridgeStats:
    """Shell counters (the core keeps its own in ``core.stats``)."""

    received: int = 0
    replayed: int = 0
    dead_lettered: int = 0
    published_batches: int = 0
    redis_retries: int = 0
    dropped_on_stop: int = 0


class KVBridge:
    """Subscribes to one engine publisher and republishes its events as Tideserve events."""

    def __init__(
        self,
        settings: KVBridgeSettings,
        redis: aioredis.Redis,
        *,
        wall: Callable[[], float] = time.time,
        context: zmq.asyncio.Context | None = None,
    ) -> None:
        self.settings = settings
        self.wall = wall
        self.stream = stream_name(settings.stream_prefix, "kv", settings.deployment)
        self.producer = StreamProducer(redis, maxlen=settings.stream_maxlen)
        self._ctx = context or zmq.asyncio.Context.instance()
        cfg = TranslateConfig(
            deployment=settings.deployment,
            instance_id=settings.effective_instance_id,
            tenant=settings.tenant,
            kv_group=None if settings.kv_group < 0 else settings.kv_group,
            block_size=settings.block_size,
        )
        self.core = BridgeCore(
            cfg, replay=settings.replay_endpoint is not None, now_ms=self._now_ms()
        )
        self.stats = BridgeStats()
        self._stop = asyncio.Event()

    def _now_ms(self) -> int:
        return int(self.wall() * 1000)

    async def run(self, stop: asyncio.Event, ready: asyncio.Event | None = None) -> None:
        """Bridge until ``stop`` is set. ``ready`` is set once the SUB socket is connected."""
        self._stop = stop
        sub = self._ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.RCVHWM, _RCV_HWM)
        sub.setsockopt(zmq.SUBSCRIBE, self.settings.topic.encode())
        sub.connect(self.settings.endpoint)
        log.info(
            "kv-bridge %s: %s engine at %s → %s (epoch %d)",
            self.core.cfg.instance_id,
            self.settings.engine.value,
            self.settings.endpoint,
            self.stream,
            self.core.epoch,
        )
        monitor = sub.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        poller = zmq.asyncio.Poller()
        poller.register(sub, zmq.POLLIN)
        poller.register(monitor, zmq.POLLIN)
        try:
            if ready is not None:
                ready.set()
            start = self.core.start()
            if start is not None:
                await self._replay(start)
            while not stop.is_set():
                ready_socks = dict(await poller.poll(timeout=_POLL_MS))
                if monitor in ready_socks:
                    await self._on_monitor(parse_monitor_message(await monitor.recv_multipart()))
                if sub in ready_socks:
                    await self._on_live(await sub.recv_multipart())
        finally:
            sub.disable_monitor()
            monitor.close(linger=0)
            sub.close(linger=0)
            log.info(
                "kv-bridge %s stopped: %s %s",
                self.core.cfg.instance_id,
                self.stats,
                self.core.stats,
            )

    # ------------------------------------------------------------------ live / replay

    async def _on_monitor(self, event: Mapping[str, object]) -> None:
        """The SUB socket's connection to the publisher dropped or came back."""
        if event["event"] == zmq.EVENT_DISCONNECTED:
            log.info("kv-bridge %s: publisher disconnected", self.core.cfg.instance_id)
            self.core.on_disconnected()
        elif event["event"] == zmq.EVENT_CONNECTED:
            step = self.core.on_connected(self._now_ms())
            await self._publish(step.batches)
            if step.replay_from is not None:
                await self._replay(step.replay_from)

    async def _on_live(self, frames: list[bytes]) -> None:
        self.stats.received += 1
        try:
            msg = decode_live(frames)
        except WireError as exc:
            await self._dead_letter("?", str(exc), {f"frame{i}": f for i, f in enumerate(frames)})
            self.core.mark_lost()
            return
        batch = await self._decode(msg.seq, msg.topic, msg.payload)
        step = self.core.on_live(msg.seq, batch, self._now_ms())
        await self._publish(step.batches)
        if step.replay_from is not None:
            await self._replay(step.replay_from)

    async def _decode(self, seq: int, topic: bytes, payload: bytes) -> EngineBatch | None:
        try:
            return decode_batch(payload, self.settings.engine)
        except WireError as exc:
            fields = {"topic": topic, "seq": str(seq).encode(), "payload": payload}
            await self._dead_letter(str(seq), str(exc), fields)
            return None

    async def _replay(self, start_seq: int) -> None:
        """Ask the engine's replay socket for batches from ``start_seq``; then drain."""
        endpoint = self.settings.replay_endpoint
        assert endpoint is not None  # the core asks only when replay is configured
        log.info("kv-bridge %s: replay from engine seq %d", self.core.cfg.instance_id, start_seq)
        dealer = self._ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        timeout_ms = int(self.settings.replay_timeout_s * 1000)
        try:
            dealer.connect(endpoint)
            await asyncio.wait_for(
                dealer.send_multipart(encode_replay_request(start_seq)), timeout_ms / 1000
            )
            while not self._stop.is_set():
                if not await dealer.poll(timeout=timeout_ms):
                    log.warning("kv-bridge: replay from %s timed out", endpoint)
                    break
                frames = await dealer.recv_multipart()
                try:
                    seq, payload = decode_replay(frames)
                except WireError as exc:
                    await self._dead_letter("replay", str(exc), {"frames": b"|".join(frames)})
                    self.core.mark_lost()
                    continue
                if seq == END_SEQ:
                    break
                self.stats.replayed += 1
                batch = await self._decode(seq, b"", payload)
                await self._publish(self.core.on_replayed(seq, batch, self._now_ms()))
        except (zmq.ZMQError, TimeoutError) as exc:
            log.warning("kv-bridge: replay from %s failed: %r", endpoint, exc)
        finally:
            dealer.close(linger=0)
            await self._publish(self.core.replay_done(self._now_ms()))

    # ------------------------------------------------------------------ Redis

    async def _publish(self, batches: list[events_pb2.KVEventBatch]) -> None:
        """XADD ``batches`` in order; retry Redis errors with backoff until stopped."""
        if not batches:
            return
        delay = 0.1
        while True:
            try:
                await self.producer.publish_many(self.stream, batches)
                self.stats.published_batches += len(batches)
                return
            except (RedisError, OSError) as exc:
                if self._stop.is_set():
                    self.stats.dropped_on_stop += len(batches)
                    log.error(
                        "kv-bridge: stopping with %d unpublished batches: %s", len(batches), exc
                    )
                    return
                self.stats.redis_retries += 1
                log.warning("kv-bridge: Redis publish failed (%s); retrying in %.1fs", exc, delay)
                await pause(self._stop, delay)
                delay = min(delay * 2, 2.0)

    async def _dead_letter(self, entry: str, error: str, fields: dict[str, bytes]) -> None:
        self.stats.dead_lettered += 1
        log.warning("kv-bridge: undecodable engine message %s: %s", entry, error)
        record = events_pb2.DeadLetter(
            stream=self.stream,
            entry_id=f"zmq:{entry}",
            group="kv-bridge",
            error=error,
            fields=fields,
            ts_ms=self._now_ms(),
        )
        try:
            await self.producer.publish(dead_letter_stream(self.stream), record)
        except (RedisError, OSError) as exc:
            log.error("kv-bridge: cannot dead-letter message %s: %s", entry, exc)
