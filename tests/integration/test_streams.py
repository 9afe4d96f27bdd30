"""Redis streams layer against a real Redis: delivery, trimming, groups, reclaim, dead letters."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest
from tideserve.v1 import events_pb2

from services.common.streams import (
    StreamConsumer,
    StreamProducer,
    check_redis,
    decode_entry,
    encode_entry,
)

Rec = events_pb2.RequestRecord


class Recorder:
    """Handler fake: records (request_id, entry_id); fails the first `fail_first` calls per id."""

    def __init__(self, fail_first: int = 0) -> None:
        self.seen: list[tuple[str, str]] = []
        self.attempts: Counter[str] = Counter()
        self.fail_first = fail_first

    async def __call__(self, msg: Rec, entry_id: str) -> None:
        self.attempts[entry_id] += 1
        if self.attempts[entry_id] <= self.fail_first:
            raise RuntimeError(f"boom on {entry_id}")
        self.seen.append((msg.request_id, entry_id))

    @property
    def ids(self) -> list[str]:
        return [rid for rid, _ in self.seen]


def consumer(
    client: Any, handler: Recorder, name: str = "c1", **kw: Any
) -> StreamConsumer[events_pb2.RequestRecord]:
    return StreamConsumer(client, "ts:requests", "g", name, handler, Rec, block_ms=0, **kw)


async def delivered(client: Any, ids: Sequence[str]) -> dict[str, int]:
    """Delivery count of each pending id (XPENDING)."""
    rows = await client.xpending_range("ts:requests", "g", min="-", max="+", count=100)
    counts = {r["message_id"].decode(): int(r["times_delivered"]) for r in rows}
    return {i: counts[i] for i in ids} if ids else counts


async def pending_count(client: Any) -> int:
    info = await client.xpending("ts:requests", "g")
    return int(info["pending"])


async def test_publish_consume_roundtrip_in_order_and_acked(redis_client: Any) -> None:
    producer = StreamProducer(redis_client)
    first = await producer.publish("ts:requests", Rec(request_id="a"))
    rest = await producer.publish_many("ts:requests", [Rec(request_id="b"), Rec(request_id="c")])
    assert await producer.publish_many("ts:requests", []) == []
    handler = Recorder()
    c = consumer(redis_client, handler)
    assert await c.poll_once() == 3
    assert handler.seen == [("a", first), ("b", rest[0]), ("c", rest[1])]
    assert await pending_count(redis_client) == 0
    assert await c.poll_once() == 0


async def test_maxlen_trims_approximately(redis_client: Any) -> None:
    producer = StreamProducer(redis_client, maxlen=10)
    for chunk in range(10):
        await producer.publish_many(
            "ts:requests", [Rec(request_id=f"{chunk}-{i}") for i in range(100)]
        )
    length = await redis_client.xlen("ts:requests")
    # "~" trims whole macro-nodes (100 entries by default): never below maxlen, far below 1000.
    assert 10 <= length <= 200


async def test_two_consumers_in_a_group_share_the_work(redis_client: Any) -> None:
    producer = StreamProducer(redis_client)
    await producer.publish_many("ts:requests", [Rec(request_id=str(i)) for i in range(20)])
    a, b = Recorder(), Recorder()
    ca, cb = consumer(redis_client, a, "a", batch=4), consumer(redis_client, b, "b", batch=4)
    while await ca.poll_once() + await cb.poll_once():
        pass
    assert a.ids and b.ids
    assert sorted(a.ids + b.ids, key=int) == [str(i) for i in range(20)]
    assert await pending_count(redis_client) == 0


@pytest.mark.parametrize(
    ("claim_idle_ms", "reclaimed"),
    [(0, True), (600_000, False)],
    ids=["idle-long-enough-reclaimed", "not-idle-enough-left-alone"],
)
async def test_entries_of_a_dead_consumer_are_reclaimed(
    redis_client: Any, claim_idle_ms: int, reclaimed: bool
) -> None:
    producer = StreamProducer(redis_client)
    handler = Recorder()
    survivor = consumer(redis_client, handler, "survivor", claim_idle_ms=claim_idle_ms)
    await survivor.ensure_group()
    await producer.publish_many("ts:requests", [Rec(request_id="x"), Rec(request_id="y")])
    # "dead" reads both entries and never acknowledges them (it crashed).
    taken = await redis_client.xreadgroup("g", "dead", {"ts:requests": ">"}, count=10)
    assert len(taken[0][1]) == 2
    await survivor.poll_once()
    if reclaimed:
        assert handler.ids == ["x", "y"]
        assert survivor.stats.reclaimed == 2
        assert await pending_count(redis_client) == 0
    else:
        assert handler.ids == []
        assert await pending_count(redis_client) == 2


async def test_pending_entry_trimmed_away_is_acknowledged(redis_client: Any) -> None:
    producer = StreamProducer(redis_client)
    handler = Recorder()
    survivor = consumer(redis_client, handler, "survivor", claim_idle_ms=0)
    await survivor.ensure_group()
    await producer.publish_many("ts:requests", [Rec(request_id="x"), Rec(request_id="y")])
    await redis_client.xreadgroup("g", "dead", {"ts:requests": ">"}, count=10)
    first = (await redis_client.xrange("ts:requests", count=1))[0][0]
    await redis_client.xdel("ts:requests", first)
    await survivor.poll_once()
    assert handler.ids == ["y"]
    assert await pending_count(redis_client) == 0
    assert survivor.stats.vanished == 1


@pytest.mark.parametrize(
    "bad_fields",
    [
        {b"t": b"tideserve.v1.RequestRecord", b"p": b"\xff\xff\xff\xff"},
        {b"t": b"tideserve.v1.LoadSnapshot", b"p": b""},
        {b"hello": b"world"},
    ],
    ids=["garbage-payload", "wrong-type", "foreign-fields"],
)
async def test_undecodable_entry_goes_to_dead_letter_and_consumer_continues(
    redis_client: Any, bad_fields: dict[bytes, bytes]
) -> None:
    producer = StreamProducer(redis_client)
    await producer.publish("ts:requests", Rec(request_id="before"))
    bad_id = (await redis_client.xadd("ts:requests", bad_fields)).decode()
    await producer.publish("ts:requests", Rec(request_id="after"))
    handler = Recorder()
    c = consumer(redis_client, handler)
    assert await c.poll_once() == 3
    assert handler.ids == ["before", "after"]
    assert await pending_count(redis_client) == 0
    dead = await redis_client.xrange("ts:requests:dead")
    assert len(dead) == 1
    letter = decode_entry(dead[0][1], events_pb2.DeadLetter)
    assert letter.stream == "ts:requests"
    assert letter.entry_id == bad_id
    assert letter.group == "g"
    assert letter.error
    assert {k.encode(): v for k, v in letter.fields.items()} == bad_fields


async def test_handler_exception_leaves_entry_pending_then_it_is_retried(
    redis_client: Any,
) -> None:
    producer = StreamProducer(redis_client)
    entry_id = await producer.publish("ts:requests", Rec(request_id="flaky"))
    await producer.publish("ts:requests", Rec(request_id="fine"))
    handler = Recorder(fail_first=1)
    c = consumer(redis_client, handler, claim_idle_ms=0)
    await c.poll_once()
    assert handler.ids == []  # both failed on their first attempt
    assert c.stats.failed == 2
    assert await pending_count(redis_client) == 2
    await c.poll_once()
    assert handler.ids == ["flaky", "fine"]
    assert handler.attempts[entry_id] == 2
    assert await pending_count(redis_client) == 0


@pytest.mark.parametrize(
    ("max_attempts", "polls", "dead", "pending"),
    [(2, 2, 1, 0), (3, 2, 0, 1), (1, 1, 1, 0)],
    ids=["given-up-after-2", "not-yet-at-3", "first-failure-at-1"],
)
async def test_poison_entry_is_dead_lettered_after_max_attempts(
    redis_client: Any, max_attempts: int, polls: int, dead: int, pending: int
) -> None:
    await StreamProducer(redis_client).publish("ts:requests", Rec(request_id="poison"))
    handler = Recorder(fail_first=1_000)
    c = consumer(redis_client, handler, claim_idle_ms=0, max_attempts=max_attempts)
    for _ in range(polls):
        await c.poll_once()
    assert await redis_client.xlen("ts:requests:dead") == dead
    assert await pending_count(redis_client) == pending
    if dead:
        row = (await redis_client.xrange("ts:requests:dead"))[0][1]
        error = decode_entry(row, events_pb2.DeadLetter).error
        assert f"handler failed on delivery {max_attempts}" in error
        assert "boom on" in error


async def test_group_deleted_under_the_consumer_is_recreated(redis_client: Any) -> None:
    handler = Recorder()
    c = consumer(redis_client, handler)
    await c.poll_once()
    await redis_client.delete("ts:requests")
    await redis_client.xadd("ts:requests", encode_entry(Rec(request_id="late")))
    await c.poll_once()
    assert handler.ids == ["late"]


async def test_run_handles_entries_until_stopped(redis_client: Any) -> None:
    got = asyncio.Event()
    seen: list[str] = []

    async def handler(msg: Rec, entry_id: str) -> None:
        seen.append(msg.request_id)
        got.set()

    c = StreamConsumer(redis_client, "ts:requests", "g", "c", handler, Rec, block_ms=50)
    stop = asyncio.Event()
    task = asyncio.create_task(c.run(stop))
    await StreamProducer(redis_client).publish("ts:requests", Rec(request_id="live"))
    await asyncio.wait_for(got.wait(), timeout=30)
    stop.set()
    await asyncio.wait_for(task, timeout=30)
    assert seen == ["live"]


def test_decode_responses_client_is_rejected() -> None:
    import redis.asyncio as aioredis

    client = aioredis.Redis(decode_responses=True)
    with pytest.raises(ValueError, match="decode_responses"):
        StreamProducer(client)


async def test_check_redis(redis_url: str) -> None:
    await check_redis(redis_url)


@pytest.mark.parametrize(
    "url",
    ["redis://127.0.0.1:1/0", "redis://:secret@127.0.0.1:1/0", "notascheme://x"],
    ids=["refused", "password-redacted", "bad-scheme"],
)
async def test_check_redis_unreachable_raises_one_line(url: str) -> None:
    with pytest.raises(ConnectionError) as info:
        await check_redis(url, timeout_s=2)
    text = str(info.value)
    assert "\n" not in text
    assert "secret" not in text


async def test_run_survives_a_redis_restart_and_keeps_the_group(tmp_path: Any) -> None:
    """A private embedded Redis is stopped and restarted under a running consumer: entries
    written before the restart (AOF) and after it are all handled (at least once)."""
    import redis.asyncio as aioredis

    from services.common.embedded import start_redis

    server = start_redis(tmp_path, 0)
    client = aioredis.Redis.from_url(server.url)
    seen: list[str] = []
    got = asyncio.Event()

    async def handler(msg: Rec, entry_id: str) -> None:
        seen.append(msg.request_id)
        if {"before", "after"} <= set(seen):
            got.set()

    c = StreamConsumer(
        client, "ts:requests", "g", "c", handler, Rec, block_ms=50, claim_idle_ms=100
    )
    stop = asyncio.Event()
    task = asyncio.create_task(c.run(stop, retry_s=0.05))
    try:
        await StreamProducer(client).publish("ts:requests", Rec(request_id="before"))
        server.stop()
        await asyncio.sleep(0.2)  # let the consumer hit the outage at least once
        server = start_redis(tmp_path, server.port)
        await StreamProducer(client).publish("ts:requests", Rec(request_id="after"))
        await asyncio.wait_for(got.wait(), timeout=60)
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=30)
        await client.aclose()
        server.stop()
    assert set(seen) == {"before", "after"}


async def test_batch_handler_gets_a_read_at_once_and_acks_only_after_it_returns(
    redis_client: Any,
) -> None:
    calls: list[list[str]] = []
    fail = [True]

    async def handle(entries: Sequence[tuple[str, Rec]]) -> None:
        calls.append([msg.request_id for _, msg in entries])
        if fail[0]:
            raise ConnectionError("database down")  # transient: the read is held

    producer = StreamProducer(redis_client)
    await producer.publish_many("ts:requests", [Rec(request_id=f"r{i}") for i in range(5)])
    await redis_client.xadd("ts:requests", {b"t": b"nope", b"p": b""})
    c: StreamConsumer[Rec] = StreamConsumer(
        redis_client, "ts:requests", "g", "c1", None, Rec, batch_handler=handle, block_ms=0,
        claim_idle_ms=0,
    )  # fmt: skip
    assert await c.poll_once() == 6
    assert calls == [["r0", "r1", "r2", "r3", "r4"]]
    assert await pending_count(redis_client) == 5  # the undecodable one was dead-lettered
    assert c.held == 5
    fail[0] = False
    assert await c.poll_once() == 5  # retried as a whole, handled, acknowledged
    assert calls[-1] == ["r0", "r1", "r2", "r3", "r4"]
    assert await pending_count(redis_client) == 0
    assert (c.stats.failed, c.stats.handled, c.stats.dead) == (5, 5, 1)
    assert await delivered(redis_client, []) == {}  # nothing left pending


@pytest.mark.parametrize("both", [True, False], ids=["both", "neither"])
async def test_exactly_one_of_handler_and_batch_handler(redis_client: Any, both: bool) -> None:
    async def handle(entries: Sequence[tuple[str, Rec]]) -> None:
        return None

    with pytest.raises(ValueError, match="exactly one"):
        StreamConsumer(
            redis_client, "ts:requests", "g", "c1", Recorder() if both else None, Rec,
            batch_handler=handle if both else None,
        )  # fmt: skip


async def test_transient_failure_is_held_and_retried_without_counting_a_delivery(
    redis_client: Any,
) -> None:
    """A handler that cannot reach its database (transient) never uses up the attempts of
    its entries: they are retried in order, first, by the next polls, delivered once."""
    producer = StreamProducer(redis_client)
    ids = await producer.publish_many("ts:requests", [Rec(request_id=f"r{i}") for i in range(3)])
    down = [True]
    seen: list[str] = []

    async def handler(msg: Rec, entry_id: str) -> None:
        if down[0] and msg.request_id == "r1":
            raise ConnectionRefusedError("postgres is down")
        seen.append(msg.request_id)

    c = StreamConsumer(
        redis_client, "ts:requests", "g", "c1", handler, Rec, block_ms=0, max_attempts=1
    )
    await c.poll_once()
    assert (seen, c.held) == (["r0"], 2)  # r1 and the entry after it are held, in order
    for _ in range(3):  # more than max_attempts tries while the database is down
        await c.poll_once()
    assert await delivered(redis_client, ids[1:]) == {ids[1]: 1, ids[2]: 1}
    down[0] = False
    await c.poll_once()
    assert (seen, c.held, c.stats.dead) == (["r0", "r1", "r2"], 0, 0)
    assert await pending_count(redis_client) == 0


async def test_entry_that_kills_its_consumer_is_dead_lettered_at_reclaim(
    redis_client: Any,
) -> None:
    """A consumer that dies handling an entry never acks it nor gives a verdict; once the
    entry has been delivered more than max_attempts times, reclaim dead-letters it unhandled."""
    entry_id = await StreamProducer(redis_client).publish("ts:requests", Rec(request_id="x"))
    await redis_client.xgroup_create("ts:requests", "g", id="0")
    # delivered to a consumer, then reclaimed by another: two deliveries, both "died"
    await redis_client.xreadgroup("g", "dead1", {"ts:requests": ">"})
    await redis_client.xclaim("ts:requests", "g", "dead2", 0, [entry_id])
    handler = Recorder()
    c = consumer(redis_client, handler, claim_idle_ms=0, max_attempts=2)
    await c.poll_once()
    assert handler.ids == []
    assert await pending_count(redis_client) == 0
    row = (await redis_client.xrange("ts:requests:dead"))[0][1]
    letter = decode_entry(row, events_pb2.DeadLetter)
    assert (letter.entry_id, letter.group) == (entry_id, "g")
    assert "never acknowledged" in letter.error


async def test_batch_fault_is_isolated_and_only_the_bad_entry_is_dead_lettered(
    redis_client: Any,
) -> None:
    calls: list[list[str]] = []

    async def handle(entries: Sequence[tuple[str, Rec]]) -> None:
        calls.append([msg.request_id for _, msg in entries])
        if any(msg.request_id == "bad" for _, msg in entries):
            raise ValueError("cannot store this record")

    names = ["a", "bad", "c"]
    await StreamProducer(redis_client).publish_many(
        "ts:requests", [Rec(request_id=n) for n in names]
    )
    c: StreamConsumer[Rec] = StreamConsumer(
        redis_client, "ts:requests", "g", "c1", None, Rec, batch_handler=handle, block_ms=0,
        claim_idle_ms=0, max_attempts=2,
    )  # fmt: skip
    await c.poll_once()
    assert calls == [names, ["a"], ["bad"], ["c"]]
    assert await pending_count(redis_client) == 1  # "bad", one attempt left
    await c.poll_once()  # reclaimed (delivery 2), fails again: dead
    assert calls[-1] == ["bad"]
    assert await pending_count(redis_client) == 0
    assert await redis_client.xlen("ts:requests:dead") == 1
    assert (c.stats.handled, c.stats.dead) == (2, 1)
