"""StreamFollower (plain-XREAD cursor) against a real Redis: start positions, batches,
undecodable entries, failing callbacks, Redis errors and a restart, a clean stop while
blocked. Waits are on conditions (polled), never on sleeps; no timing assertions."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from tideserve.v1 import events_pb2

from services.common.streams import (
    FOLLOWER_COUNTERS,
    Start,
    StreamFollower,
    StreamProducer,
    decode_entry,
    encode_entry,
    newest_id,
)
from services.common.streams.ids import parse_id

Rec = events_pb2.RequestRecord
STREAM = "ts:follow"


class Seen:
    """The callback: records (request_id, entry_id); raises for ids in ``fail``."""

    def __init__(self, fail: frozenset[str] = frozenset()) -> None:
        self.got: list[tuple[str, str]] = []
        self.fail = fail

    def __call__(self, msg: Rec, entry_id: str) -> None:
        if msg.request_id in self.fail:
            raise RuntimeError(f"cannot apply {msg.request_id}")
        self.got.append((msg.request_id, entry_id))

    @property
    def ids(self) -> list[str]:
        return [rid for rid, _ in self.got]


def follower(redis: Any, seen: Seen, **kw: Any) -> StreamFollower[Rec]:
    return StreamFollower(redis, STREAM, Rec, seen, **kw)


async def add(redis: Any, rid: str, entry_id: str = "*") -> str:
    raw = await redis.xadd(STREAM, encode_entry(Rec(request_id=rid)), id=entry_id)
    return raw.decode() if isinstance(raw, bytes) else str(raw)


async def eventually(cond: Callable[[], Awaitable[bool] | bool], what: str) -> None:
    """Poll ``cond`` every 10 ms, up to 3000 times (it is the condition that ends the wait)."""
    for _ in range(3000):
        res = cond()
        if await res if isinstance(res, Awaitable) else res:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never happened: {what}")


# ----------------------------------------------------------------------------- start


@pytest.mark.parametrize(
    ("start", "wall_s", "expected"),
    [
        (Start.beginning(), 0.0, ["a", "b", "c", "d"]),
        (Start.after("2000-0"), 0.0, ["c", "d"]),
        ("2000-0", 0.0, ["c", "d"]),
        (Start.after("4000-0"), 0.0, []),
        (Start.seconds_back(2.5), 5.0, ["c", "d"]),  # from 2500-0
        (Start.seconds_back(60.0), 5.0, ["a", "b", "c", "d"]),  # clamped to 0-0
        (Start.newest(), 0.0, []),
        ("$", 0.0, []),
    ],
    ids=[
        "beginning",
        "after-id",
        "after-id-str",
        "after-last",
        "seconds-back",
        "seconds-back-clamped",
        "newest",
        "newest-str",
    ],
)
async def test_start_positions(
    redis_client: Any, start: Start | str, wall_s: float, expected: list[str]
) -> None:
    for rid, eid in (("a", "1000-0"), ("b", "2000-0"), ("c", "3000-0"), ("d", "4000-0")):
        await add(redis_client, rid, eid)
    seen = Seen()
    f = follower(redis_client, seen, start=start, wall=lambda: wall_s)
    assert f.position is None
    assert await f.poll_once(block_ms=0) == len(expected)
    assert seen.ids == expected
    assert f.position == "4000-0"  # where it starts, or the last entry read
    assert f.stats["read"] == f.stats["handled"] == len(expected)


async def test_newest_is_pinned_so_entries_between_reads_are_not_missed(
    redis_client: Any,
) -> None:
    await add(redis_client, "old")
    seen = Seen()
    f = follower(redis_client, seen, start=Start.newest())
    assert await f.resolve_start() == await newest_id(redis_client, STREAM)
    await add(redis_client, "new-1")  # between the pin and the first read
    await add(redis_client, "new-2")
    assert await f.poll_once(block_ms=0) == 2
    assert seen.ids == ["new-1", "new-2"]


async def test_newest_of_an_empty_stream_reads_from_the_beginning(redis_client: Any) -> None:
    seen = Seen()
    f = follower(redis_client, seen)  # default start: newest
    assert await f.poll_once(block_ms=0) == 0 and f.position == "0-0"
    await add(redis_client, "first")
    assert await f.poll_once(block_ms=0) == 1 and seen.ids == ["first"]


async def test_seek_moves_the_cursor(redis_client: Any) -> None:
    for rid, eid in (("a", "1-0"), ("b", "2-0"), ("c", "3-0")):
        await add(redis_client, rid, eid)
    seen = Seen()
    f = follower(redis_client, seen, start=Start.beginning())
    await f.poll_once(block_ms=0)
    f.seek("1-0")
    assert not f.caught_up
    assert await f.poll_once(block_ms=0) == 2
    assert seen.ids == ["a", "b", "c", "b", "c"]
    with pytest.raises(ValueError, match="not a stream entry id"):
        f.seek("$")


# ----------------------------------------------------------------------------- batches


async def test_batches_of_count_and_caught_up_at_the_end(redis_client: Any) -> None:
    await StreamProducer(redis_client).publish_many(
        STREAM, [Rec(request_id=str(i)) for i in range(7)]
    )
    seen = Seen()
    f = follower(redis_client, seen, start=Start.beginning(), count=3)
    sizes = []
    while not f.caught_up:
        sizes.append(await f.poll_once(block_ms=0))
    assert sizes == [3, 3, 1]
    assert seen.ids == [str(i) for i in range(7)]
    assert [eid for _, eid in seen.got] == sorted((eid for _, eid in seen.got), key=parse_id)
    assert f.position == seen.got[-1][1]
    assert await f.poll_once(block_ms=0) == 0  # nothing re-read


# ----------------------------------------------------------------------------- bad entries


@pytest.mark.parametrize("dead_letter", [False, True], ids=["skipped", "dead-lettered"])
async def test_undecodable_entries_are_counted_and_skipped(
    redis_client: Any, dead_letter: bool
) -> None:
    seen = Seen()
    f = follower(redis_client, seen, start=Start.beginning(), dead_letter=dead_letter)
    await add(redis_client, "before")
    garbage = await redis_client.xadd(
        STREAM, {b"t": Rec.DESCRIPTOR.full_name.encode(), b"p": b"\xff\xfe"}
    )
    other = await redis_client.xadd(STREAM, encode_entry(events_pb2.LoadSnapshot()))
    bare = await redis_client.xadd(STREAM, {b"x": b"1"})
    await add(redis_client, "after")
    assert await f.poll_once(block_ms=0) == 5
    assert seen.ids == ["before", "after"]
    assert f.stats == f.stats | {"read": 5, "handled": 2, "undecodable": 3, "failed": 0}
    dead = await redis_client.xrange(STREAM + ":dead")
    if not dead_letter:
        assert dead == [] and f.stats["dead_lettered"] == 0
        return
    assert f.stats["dead_lettered"] == 3
    records = [decode_entry(fields, events_pb2.DeadLetter) for _, fields in dead]
    assert [r.entry_id for r in records] == [i.decode() for i in (garbage, other, bare)]
    assert {r.stream for r in records} == {STREAM} and {r.group for r in records} == {""}
    assert "does not parse" in records[0].error and "expected" in records[1].error
    assert records[0].fields["p"] == b"\xff\xfe"


@pytest.mark.parametrize("dead_letter", [False, True], ids=["skipped", "dead-lettered"])
async def test_a_failing_callback_is_counted_and_the_cursor_moves_on(
    redis_client: Any, dead_letter: bool
) -> None:
    seen = Seen(fail=frozenset({"bad"}))
    f = follower(redis_client, seen, start=Start.beginning(), dead_letter=dead_letter)
    for rid in ("ok-1", "bad", "ok-2"):
        await add(redis_client, rid)
    assert await f.poll_once(block_ms=0) == 3
    assert seen.ids == ["ok-1", "ok-2"]
    assert (f.stats["handled"], f.stats["failed"]) == (2, 1)
    assert await f.poll_once(block_ms=0) == 0
    dead = [
        decode_entry(v, events_pb2.DeadLetter)
        for _, v in await redis_client.xrange(STREAM + ":dead")
    ]
    assert len(dead) == f.stats["dead_lettered"] == int(dead_letter)
    if dead_letter:
        assert "callback failed" in dead[0].error
        assert decode_entry(dead[0].fields, Rec).request_id == "bad"


async def test_counters_go_into_the_callers_dict_under_its_names(redis_client: Any) -> None:
    stats = {"applied": 0, "undecodable": 0, "errors": 0}
    f = follower(
        redis_client,
        Seen(),
        start=Start.beginning(),
        stats=stats,
        stat_names={"read": "batches", "undecodable": "undecodable", "errors": "errors"},
    )
    assert f.stats is stats
    await add(redis_client, "x")
    await redis_client.xadd(STREAM, {b"x": b"1"})
    await f.poll_once(block_ms=0)
    assert stats == {"applied": 0, "undecodable": 1, "errors": 0, "batches": 2}


def test_unknown_counter_names_and_bad_settings_are_rejected(redis_client: Any) -> None:
    with pytest.raises(ValueError, match="unknown follower counters"):
        follower(redis_client, Seen(), stat_names={"reads": "reads"})
    with pytest.raises(ValueError, match="count"):
        follower(redis_client, Seen(), count=0)
    with pytest.raises(ValueError, match="retry_s"):
        follower(redis_client, Seen(), retry_s=2.0, max_retry_s=1.0)
    with pytest.raises(ValueError, match="not a stream entry id"):
        Start.after("later")


def test_default_stats_has_every_counter(redis_client: Any) -> None:
    assert follower(redis_client, Seen()).stats == dict.fromkeys(FOLLOWER_COUNTERS, 0)


# ----------------------------------------------------------------------------- errors


async def test_redis_errors_are_counted_retried_and_recovered(redis_client: Any) -> None:
    await redis_client.set(STREAM, b"not a stream")  # XREAD answers WRONGTYPE
    seen = Seen()
    polls: list[int] = []

    async def after_poll(n: int) -> None:
        polls.append(n)

    f = follower(
        redis_client,
        seen,
        start=Start.beginning(),
        block_ms=50,
        retry_s=0.01,
        max_retry_s=0.02,
        after_poll=after_poll,
    )
    f.start()
    try:
        await eventually(lambda: f.stats["errors"] >= 3, "retried errors")
        assert polls == []  # after_poll runs after successful reads only
        await redis_client.delete(STREAM)
        await add(redis_client, "after the fix")
        await eventually(lambda: seen.ids == ["after the fix"], "recovered read")
        assert 1 in polls
    finally:
        await f.stop()
    assert f.task is None


async def test_an_after_poll_redis_error_is_counted_and_retried(redis_client: Any) -> None:
    from redis.exceptions import ConnectionError as RedisConnectionError

    failures = [RedisConnectionError("gone"), RedisConnectionError("gone again")]

    async def after_poll(_n: int) -> None:
        if failures:
            raise failures.pop()

    f = follower(redis_client, Seen(), block_ms=20, retry_s=0.01, after_poll=after_poll)
    f.start()
    try:
        await eventually(lambda: not failures, "after_poll failures")
        assert f.stats["errors"] == 2
    finally:
        await f.stop()


async def test_a_redis_restart_is_survived_without_rereading(tmp_path: Path) -> None:
    import redis.asyncio as aioredis

    from services.common.embedded import EmbeddedStartError, start_redis

    try:
        server = await asyncio.to_thread(start_redis, tmp_path / "redis", 0)
    except EmbeddedStartError as exc:
        pytest.skip(f"no embedded redis: {exc}")
    client = aioredis.Redis.from_url(server.url)
    seen = Seen()
    f = follower(client, seen, start=Start.beginning(), block_ms=50, retry_s=0.01, max_retry_s=0.05)
    f.start()
    try:
        await add(client, "before")
        await eventually(lambda: seen.ids == ["before"], "read before the restart")
        await asyncio.to_thread(server.stop)
        await eventually(lambda: f.stats["errors"] >= 1, "error while Redis is down")
        server = await asyncio.to_thread(start_redis, tmp_path / "redis", server.port)
        writer = aioredis.Redis.from_url(server.url)  # the test's pooled connection died too
        try:
            await add(writer, "after")  # the AOF kept "before": only "after" is new
        finally:
            await writer.aclose()
        await eventually(lambda: seen.ids == ["before", "after"], "read after the restart")
    finally:
        await f.stop()
        await client.aclose()
        await asyncio.to_thread(server.stop)
    assert f.stats["handled"] == 2


# ----------------------------------------------------------------------------- stop


async def _blocked_in_xread(redis: Any) -> bool:
    clients = await redis.client_list()
    return any(c.get("cmd") == "xread" and "b" in c.get("flags", "") for c in clients)


async def test_stop_while_blocked_lets_the_read_return_and_never_cancels(
    redis_client: Any,
) -> None:
    seen = Seen()
    f = follower(redis_client, seen, block_ms=200)
    f.start()
    task = f.task
    assert task is not None
    await eventually(lambda: _blocked_in_xread(redis_client), "follower blocked in XREAD")
    await asyncio.wait_for(f.stop(), 30)  # a hang fails here, not at the suite timeout
    assert task.done() and not task.cancelled() and task.exception() is None
    assert f.task is None
    await f.stop()  # idempotent
    # the connection the read used is healthy: the same client reads on
    await add(redis_client, "later")
    assert await f.poll_once(block_ms=0) == 1 and seen.ids == ["later"]


async def test_run_in_the_callers_task_ends_on_request_stop(redis_client: Any) -> None:
    seen = Seen()
    f = follower(redis_client, seen, block_ms=100)
    task = asyncio.create_task(f.run())
    await add(redis_client, "x")  # the pin may land before or after it
    await eventually(lambda: _blocked_in_xread(redis_client), "follower blocked in XREAD")
    await add(redis_client, "y")
    await eventually(lambda: "y" in seen.ids, "read while running")
    f.request_stop()
    await asyncio.wait_for(task, 30)
    assert not task.cancelled()


async def test_a_shared_stopping_event_ends_run(redis_client: Any) -> None:
    stopping = asyncio.Event()
    f = follower(redis_client, Seen(), block_ms=50, stopping=stopping)
    task = asyncio.create_task(f.run())
    await eventually(lambda: _blocked_in_xread(redis_client), "follower blocked in XREAD")
    stopping.set()
    await asyncio.wait_for(task, 30)
    assert f.stopping is stopping and not task.cancelled()
