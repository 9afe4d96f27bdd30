"""Real ZMQ sockets publishing engine-format KV events → kv-bridge → real Redis stream.

The engine side is played by :class:`EngineSide`: an XPUB socket (wire-identical to the
engines' PUB socket for subscribers; XPUB lets the test wait until the bridge's subscription
arrived instead of sleeping) and a ROUTER replay socket answering like vLLM's/SGLang's
``ZmqEventPublisher._service_replay``: one ``[id, b"", seq, payload]`` per buffered batch with
``seq >= start``, then ``[id, b"", -1, b""]``. Messages are built with msgpack in the engines'
exact formats (tests/unit/_kv_bridge_helpers.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import socket
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import zmq
import zmq.asyncio
from tideserve.v1 import common_pb2, events_pb2

from services.common.streams import dead_letter_stream, decode_entry
from services.kvbridge.run import KVBridge
from services.kvbridge.settings import KVBridgeSettings
from services.kvbridge.wire import MASK64
from tests.unit._kv_bridge_helpers import (
    SGLANG_BATCH,
    SGLANG_REMOVED,
    SGLANG_STORED,
    as_array,
    frames,
    pack,
    vllm_cleared,
    vllm_payload,
    vllm_removed,
    vllm_stored,
)

pytestmark = pytest.mark.integration

K = events_pb2.KVEvent
WAIT_S = 15.0


class EngineSide:
    """The engine's publisher: live XPUB + ROUTER replay over a buffer of (seq, payload)."""

    def __init__(
        self,
        ctx: zmq.asyncio.Context,
        topic: bytes = b"",
        *,
        with_topic: bool = False,
        like: EngineSide | None = None,
    ) -> None:
        """``with_topic``: replay answers carry the topic frame, as vLLM 0.32 sends
        them; ``like``: bind the endpoints of that (closed) engine, as a restart does."""
        self.topic = topic
        self.with_topic = with_topic
        self.pub = ctx.socket(zmq.XPUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.router = ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        if like is None:
            port = self.pub.bind_to_random_port("tcp://127.0.0.1")
            self.endpoint = f"tcp://127.0.0.1:{port}"
            rport = self.router.bind_to_random_port("tcp://127.0.0.1")
            self.replay_endpoint = f"tcp://127.0.0.1:{rport}"
        else:
            self.endpoint, self.replay_endpoint = like.endpoint, like.replay_endpoint
            _bind_when_free(self.pub, self.endpoint)
            _bind_when_free(self.router, self.replay_endpoint)
        self.buffer: list[tuple[int, bytes]] = []
        self.replay_requests: list[int] = []
        self.replay_answered = asyncio.Event()

    async def wait_subscribed(self) -> None:
        msg = await asyncio.wait_for(self.pub.recv(), WAIT_S)
        assert msg[:1] == b"\x01", msg  # a subscription, not an unsubscription

    async def publish(self, seq: int, payload: bytes, *, send: bool = True) -> None:
        """Buffer the batch for replay; ``send=False`` simulates a batch PUB dropped."""
        self.buffer.append((seq, payload))
        if send:
            await self.pub.send_multipart(frames(seq, payload, self.topic))

    async def serve_replay(self) -> None:
        while True:
            client, _, start = await self.router.recv_multipart()
            first = int.from_bytes(start, "big")
            self.replay_requests.append(first)
            head = [client, b""] + ([self.topic] if self.with_topic else [])
            end = [client, b""] + ([b""] if self.with_topic else [])
            for seq, payload in self.buffer:
                if seq >= first:
                    await self.router.send_multipart([*head, seq.to_bytes(8, "big"), payload])
            await self.router.send_multipart([*end, (-1).to_bytes(8, "big", signed=True), b""])
            self.replay_answered.set()

    def close(self) -> None:
        self.pub.close(linger=0)
        self.router.close(linger=0)


def _bind_when_free(sock: zmq.Socket[Any], endpoint: str) -> None:
    """Bind ``endpoint`` once the closed socket that held it has released it (ZMQ closes in
    its I/O thread, after ``close`` returns)."""
    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            sock.bind(endpoint)
            return
        except zmq.ZMQError as e:
            if e.errno != zmq.EADDRINUSE or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


@pytest.fixture
async def zctx() -> AsyncIterator[zmq.asyncio.Context]:
    ctx = zmq.asyncio.Context()
    try:
        yield ctx
    finally:
        ctx.destroy(linger=0)


@contextlib.asynccontextmanager
async def running(
    ctx: zmq.asyncio.Context, redis: Any, redis_url: str, side: EngineSide, **kw: Any
) -> AsyncIterator[KVBridge]:
    settings = KVBridgeSettings(
        endpoint=side.endpoint,
        redis_url=redis_url,
        deployment=f"dep-{uuid.uuid4().hex[:8]}",
        instance_id="engine-0",
        **{"replay_timeout_s": 5.0, **kw},
    )
    bridge = KVBridge(settings, redis, context=ctx)
    stop, ready = asyncio.Event(), asyncio.Event()
    replay = asyncio.create_task(side.serve_replay())
    task = asyncio.create_task(bridge.run(stop, ready))
    try:
        await asyncio.wait_for(ready.wait(), WAIT_S)
        yield bridge
    finally:
        stop.set()
        await asyncio.wait_for(task, WAIT_S)
        replay.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await replay


async def entries(redis: Any, stream: str, n: int) -> list[tuple[bytes, dict[bytes, bytes]]]:
    """The stream's entries once it has at least ``n`` (or whatever is there after WAIT_S)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_S
    while True:
        got = await redis.xrange(stream)
        if len(got) >= n or loop.time() > deadline:
            return list(got)
        await asyncio.sleep(0.05)


async def batches(redis: Any, stream: str, n: int) -> list[events_pb2.KVEventBatch]:
    got = await entries(redis, stream, n)
    return [decode_entry(fields, events_pb2.KVEventBatch) for _, fields in got]


DIGEST = hashlib.sha256(b"block").digest()
DIGEST_U64 = int.from_bytes(DIGEST, "big") & MASK64


def vllm_messages(map_encoding: bool) -> list[bytes]:
    m = map_encoding
    return [
        vllm_payload(
            [
                vllm_stored(
                    [101, 102], parent=None, block_size=16, lora_name="sql", as_map_encoding=m
                )
            ],
            ts=1_700_000_000.5,
        ),
        vllm_payload([vllm_stored([DIGEST], parent=102, medium="CPU", as_map_encoding=m)]),
        vllm_payload([vllm_removed([101], as_map_encoding=m), vllm_cleared(as_map_encoding=m)]),
    ]


def sglang_messages() -> list[bytes]:
    def batch(events: list[Any]) -> bytes:
        return pack(as_array(None, SGLANG_BATCH, ts=1_700_000_000.5, events=events, attn_dp_rank=0))

    stored = dict(parent_block_hash=None, token_ids=list(range(32)), block_size=16, lora_id=None)
    return [
        batch([as_array("BlockStored", SGLANG_STORED, block_hashes=[101, 102], **stored)]),
        batch(
            [
                as_array(
                    "BlockStored",
                    SGLANG_STORED,
                    block_hashes=[-7],
                    parent_block_hash=102,
                    token_ids=list(range(16)),
                    block_size=16,
                    lora_id=None,
                    medium="CPU_PINNED",
                )
            ]
        ),
        batch([as_array("BlockRemoved", SGLANG_REMOVED, block_hashes=[101]), ["AllBlocksCleared"]]),
    ]


@pytest.mark.parametrize(
    ("engine_kind", "messages", "second_hash", "lora"),
    [
        ("vllm", vllm_messages(False), DIGEST_U64, "sql"),
        ("vllm", vllm_messages(True), DIGEST_U64, "sql"),
        ("sglang", sglang_messages(), (-7) & MASK64, ""),
    ],
    ids=["vllm-array-encoding", "vllm-map-encoding", "sglang"],
)
async def test_engine_events_reach_redis(
    zctx: zmq.asyncio.Context,
    redis_client: Any,
    redis_url: str,
    engine_kind: str,
    messages: list[bytes],
    second_hash: int,
    lora: str,
) -> None:
    engine = EngineSide(zctx, topic=b"kv-events")
    try:
        async with running(
            zctx, redis_client, redis_url, engine, engine=engine_kind, topic="kv-events"
        ) as bridge:
            await engine.wait_subscribed()
            for seq, payload in enumerate(messages):
                await engine.publish(seq, payload)
            got = await batches(redis_client, bridge.stream, len(messages))
    finally:
        engine.close()
    assert bridge.stream.startswith("ts:kv:dep-")
    assert [(b.deployment, b.instance_id, b.seq) for b in got] == [
        (bridge.settings.deployment, "engine-0", i + 1) for i in range(3)
    ]
    assert len({b.epoch for b in got}) == 1 and got[0].epoch > 0
    assert got[0].ts_ms == 1_700_000_000_500
    assert got[0].block_size == 16
    assert list(got[0].events) == [
        K(
            kind=K.KIND_BLOCK_STORED,
            tier=common_pb2.TIER_GPU,
            block_hashes=[101, 102],
            token_count=32,
            lora=lora,
        )
    ]
    assert list(got[1].events) == [
        K(
            kind=K.KIND_BLOCK_STORED,
            tier=common_pb2.TIER_CPU,
            block_hashes=[second_hash],
            parent_hash=102,
            token_count=16,
        )
    ]
    removed_tier = common_pb2.TIER_GPU
    assert list(got[2].events) == [
        K(kind=K.KIND_BLOCK_REMOVED, tier=removed_tier, block_hashes=[101]),
        K(kind=K.KIND_ALL_CLEARED),
    ]
    assert bridge.stats.dead_lettered == 0


async def test_startup_catch_up_and_gap_replay(
    zctx: zmq.asyncio.Context, redis_client: Any, redis_url: str
) -> None:
    engine = EngineSide(zctx)
    payloads = [vllm_payload([vllm_stored([1000 + i])]) for i in range(7)]
    try:
        # the engine published 0 and 1 before the bridge existed (only its buffer has them)
        await engine.publish(0, payloads[0], send=False)
        await engine.publish(1, payloads[1], send=False)
        async with running(
            zctx, redis_client, redis_url, engine, replay_endpoint=engine.replay_endpoint
        ) as bridge:
            await engine.wait_subscribed()
            # the bridge's start-up replay (from 0) was answered with 0 and 1 only
            await asyncio.wait_for(engine.replay_answered.wait(), WAIT_S)
            await engine.publish(2, payloads[2])
            await engine.publish(3, payloads[3], send=False)  # dropped by PUB
            await engine.publish(4, payloads[4], send=False)  # dropped by PUB
            await engine.publish(5, payloads[5])
            await engine.publish(6, payloads[6])
            got = await batches(redis_client, bridge.stream, 7)
    finally:
        engine.close()
    assert engine.replay_requests == [0, 3]
    assert [b.seq for b in got] == [1, 2, 3, 4, 5, 6, 7]
    assert len({b.epoch for b in got}) == 1
    assert [b.events[0].block_hashes[0] for b in got] == [1000 + i for i in range(7)]
    assert bridge.core.stats.new_epochs == 0
    assert bridge.core.stats.gaps == 0


async def test_malformed_dead_lettered_and_restart_new_epoch(
    zctx: zmq.asyncio.Context, redis_client: Any, redis_url: str
) -> None:
    engine = EngineSide(zctx)
    try:
        async with running(zctx, redis_client, redis_url, engine) as bridge:
            await engine.wait_subscribed()
            await engine.publish(0, vllm_payload([vllm_stored([1], as_map_encoding=True)]))
            await engine.publish(1, b"\xc1 not msgpack")
            await engine.pub.send_multipart([b"", b"short-seq", b"x"])  # bad frames
            await engine.publish(2, vllm_payload([vllm_stored([3], as_map_encoding=True)]))
            # the engine restarts: its counter starts again at 0
            await engine.publish(0, vllm_payload([vllm_stored([4], as_map_encoding=True)]))
            got = await batches(redis_client, bridge.stream, 3)
            dead = await entries(redis_client, dead_letter_stream(bridge.stream), 2)
    finally:
        engine.close()
    assert [(b.seq, b.events[0].block_hashes[0]) for b in got] == [(1, 1), (1, 3), (1, 4)]
    assert got[0].epoch < got[1].epoch < got[2].epoch
    letters = [decode_entry(f, events_pb2.DeadLetter) for _, f in dead]
    assert [d.entry_id for d in letters] == ["zmq:1", "zmq:?"]
    assert "not msgpack" in letters[0].error
    assert letters[0].fields["payload"] == b"\xc1 not msgpack"
    assert "seq frame" in letters[1].error
    assert bridge.core.stats.restarts == 1


async def test_bridged_vllm_events_match_router_hashes_in_kvmeta_index(
    zctx: zmq.asyncio.Context, redis_client: Any, redis_url: str
) -> None:
    """Engine publishes sha256 digests (vLLM's default bytes mode); a router that computes
    vllm_block_hashes over the same token ids finds them in kvmeta's prefix index."""
    import pickle

    from services.common.tokens.hashing import vllm_block_hashes, vllm_none_hash
    from services.kvmeta.index import PrefixIndex

    tokens = list(range(1000, 1064))  # 4 blocks of 16
    parent, digests = vllm_none_hash(), []
    for i in range(4):  # the engine side: vLLM's chain over full blocks
        parent = hashlib.sha256(
            pickle.dumps((parent, tuple(tokens[16 * i : 16 * i + 16]), None), protocol=5)
        ).digest()
        digests.append(parent)
    engine = EngineSide(zctx)
    try:
        async with running(zctx, redis_client, redis_url, engine) as bridge:
            await engine.wait_subscribed()
            await engine.publish(
                0, vllm_payload([vllm_stored(digests[:3], tokens=tokens[:48], block_size=16)])
            )
            await engine.publish(
                1,
                vllm_payload(
                    [vllm_stored(digests[3:], parent=digests[2], tokens=tokens[48:], medium="CPU")]
                ),
            )
            got = await batches(redis_client, bridge.stream, 2)
    finally:
        engine.close()
    index = PrefixIndex()
    for b in got:
        index.apply_batch(b.deployment, b.instance_id, b.epoch, b.seq, list(b.events), now=1.0)
    query = vllm_block_hashes([*tokens, 1, 2, 3], 16)  # the router's side
    (match,) = index.match_prefix(bridge.settings.deployment, "", query)
    assert match.instance_id == "engine-0"
    assert match.matched_blocks == 4
    assert match.tiers == {common_pb2.TIER_GPU: 3, common_pb2.TIER_CPU: 1}


async def test_replay_endpoint_down_bridge_goes_on(
    zctx: zmq.asyncio.Context, redis_client: Any, redis_url: str
) -> None:
    engine = EngineSide(zctx)
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    try:
        async with running(
            zctx, redis_client, redis_url, engine, replay_endpoint=dead, replay_timeout_s=0.3
        ) as bridge:
            await engine.wait_subscribed()
            await engine.publish(0, vllm_payload([vllm_stored([1])]))
            await engine.publish(2, vllm_payload([vllm_stored([3])]))  # gap: replay fails too
            got = await batches(redis_client, bridge.stream, 2)
    finally:
        engine.close()
    assert [(b.seq, b.events[0].block_hashes[0]) for b in got] == [(1, 1), (1, 3)]
    assert got[0].epoch < got[1].epoch
    assert bridge.core.stats.replays == 2  # start-up catch-up and the gap
    assert not engine.replay_requests


@pytest.mark.parametrize("with_topic", [False, True], ids=["older-replay", "vllm-0.32-replay"])
async def test_engine_restart_resets_the_instance_before_it_publishes(
    zctx: zmq.asyncio.Context, redis_client: Any, redis_url: str, with_topic: bool
) -> None:
    """An engine restarts and publishes nothing yet: the bridge sees its publisher go and come
    back, probes its replay buffer (empty: a new process) and publishes an epoch reset at once,
    so the index forgets the old blocks before the engine stores any."""
    old = EngineSide(zctx, b"kv", with_topic=with_topic)
    new: EngineSide | None = None
    try:
        async with running(
            zctx, redis_client, redis_url, old, topic="kv", replay_endpoint=old.replay_endpoint
        ) as bridge:
            await old.wait_subscribed()
            await old.publish(0, vllm_payload([vllm_stored([1])]))
            await old.publish(1, vllm_payload([vllm_stored([2], parent=1)]))
            assert len(await batches(redis_client, bridge.stream, 2)) == 2
            old.close()
            new = EngineSide(zctx, b"kv", with_topic=with_topic, like=old)
            replay = asyncio.create_task(new.serve_replay())
            try:
                got = await batches(redis_client, bridge.stream, 3)
            finally:
                replay.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await replay
    finally:
        old.close()
        if new is not None:
            new.close()
    assert [(b.seq, len(b.events)) for b in got] == [(1, 1), (2, 1), (1, 0)]
    assert got[2].epoch > got[0].epoch
    assert new.replay_requests == [0]
    assert (bridge.core.stats.disconnects, bridge.core.stats.restarts) == (1, 1)
