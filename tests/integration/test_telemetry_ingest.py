"""Telemetry ingest against real Postgres and Redis: the consumer group with a crash between
commit and ack, ReportRecords with a mixed batch, GetSession, rollups answering old windows,
two replicas, partitions and retention."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass

import grpc
import psycopg
import pytest
import redis.asyncio as aioredis
from tideserve.v1 import events_pb2, telemetry_pb2, telemetry_pb2_grpc

from services.common.db import migrate, to_libpq_url
from services.common.streams import StreamProducer, stream_name
from services.telemetry.ingest.pipeline import Ingest, IngestResult
from services.telemetry.ingest.stream import records_consumer
from services.telemetry.query import WindowQuery
from services.telemetry.servicer import TelemetryServicer, add_to_server
from services.telemetry.settings import TelemetrySettings
from services.telemetry.store.pg import RecordStore
from services.telemetry.tooltimes import ToolTimes
from services.telemetry.windows.bucket import RELATIVE_ACCURACY
from services.telemetry.windows.memory import WindowMemory
from services.telemetry.windows.stats import Filters
from services.telemetry.windows.validate import ValidationRules
from tests.helpers.records import NOW_MS, record

pytestmark = pytest.mark.integration

MIN = 60_000
DAY = 86_400_000


class Clock:
    def __init__(self, now_ms: int = NOW_MS) -> None:
        self.now_ms = now_ms

    def __call__(self) -> float:
        return self.now_ms / 1000


@dataclass
class Replica:
    store: RecordStore
    memory: WindowMemory
    ingest: Ingest
    query: WindowQuery


def replica(
    url: str, clock: Clock, replica_id: str = "r1", *, retention_ms: int = 2 * DAY
) -> Replica:
    settings = TelemetrySettings(deployments=["llama"])
    store = RecordStore(
        url,
        partition_ms=DAY,
        retention_ms=retention_ms,
        rollup_retention_ms=retention_ms,
        ahead=1,
        accuracy=RELATIVE_ACCURACY,
    )
    memory = WindowMemory(MIN, 15 * MIN)
    ingest = Ingest(
        store,
        memory,
        rules=ValidationRules.of(["llama"], 60_000, retention_ms),
        classes=settings.classes(),
        replica_id=replica_id,
        wall=clock,
    )
    return Replica(
        store, memory, ingest, WindowQuery(store, memory, settings.classes(), replica_id, clock)
    )


@pytest.fixture
def db(postgres_db_url: str) -> Iterator[str]:
    migrate(postgres_db_url, "telemetry")
    yield postgres_db_url


def scalar(url: str, query: str) -> int:
    with psycopg.connect(to_libpq_url(url)) as conn:
        row = conn.execute(query).fetchone()
    assert row is not None
    return int(row[0])


def good(n: int, prefix: str = "r", **fields: object) -> list[events_pb2.RequestRecord]:
    return [record(f"{prefix}{i}", ttft_ms=100.0 + i, **fields) for i in range(n)]  # type: ignore[arg-type]


class Crash(BaseException):
    """The process dies (not an Exception: nothing in the consumer catches it)."""


class CrashAfterCommit(Ingest):
    async def ingest(self, records: Sequence[events_pb2.RequestRecord]) -> IngestResult:
        await super().ingest(records)
        raise Crash


# ----------------------------------------------------------------------------- stream


async def test_crash_between_commit_and_ack_loses_and_duplicates_nothing(
    db: str, redis_client: aioredis.Redis
) -> None:
    clock = Clock()
    prefix = f"t{uuid.uuid4().hex[:8]}"
    stream = stream_name(prefix, "requests")
    valid = good(40)
    bad = [record("neg", queue_ms=-1.0), record("alien", deployment="mistral")]
    await StreamProducer(redis_client).publish_many(stream, [*valid[:20], *bad, *valid[20:]])
    await redis_client.xadd(stream, {b"t": b"tideserve.v1.RequestRecord", b"p": b"\xff\xff"})
    await StreamProducer(redis_client).publish(stream, valid[0])  # a gateway retried one

    first = replica(db, clock)
    first.ingest.__class__ = CrashAfterCommit
    kw = {"prefix": prefix, "group": "telemetry", "consumer": "r1", "batch": 1000, "block_ms": 0}
    consumer = records_consumer(redis_client, first.ingest, claim_idle_ms=60_000, **kw)
    with pytest.raises(Crash):
        await consumer.poll_once()
    assert scalar(db, "SELECT count(*) FROM telemetry.request_records") == 40
    pending = await redis_client.xpending(stream, "telemetry")
    assert pending["pending"] == 43  # committed, never acknowledged (the undecodable one was)

    # restart: a new process (empty memory, loaded from its rollups) reclaims the batch
    second = replica(db, clock)
    consumer = records_consumer(redis_client, second.ingest, claim_idle_ms=0, **kw)
    assert await consumer.poll_once() == 43
    assert (await redis_client.xpending(stream, "telemetry"))["pending"] == 0
    assert scalar(db, "SELECT count(*) FROM telemetry.request_records") == 40
    assert scalar(db, "SELECT count(*) FROM telemetry.request_ids") == 40
    assert second.ingest.counts.results == {"accepted": 0, "duplicate": 41, "rejected": 2}
    assert second.ingest.counts.reasons == {"negative_timing": 1, "unknown_deployment": 1}

    window = await second.query.query(Filters(), 300)
    assert window.total.requests == 40  # not 80: the redelivery counted nothing twice
    rollups = await second.query.query(Filters(), 300, end_ms=clock.now_ms)
    assert rollups.total.requests == 40
    dead = await redis_client.xrange(stream + ":dead")
    errors = sorted(events_pb2.DeadLetter.FromString(f[b"p"]).error for _, f in dead)
    assert len(errors) == 3
    assert errors[0].startswith("alien: unknown_deployment") and errors[1].startswith(
        "neg: negative_timing"
    )
    assert "does not parse" in errors[2]


# ----------------------------------------------------------------------------- windows from rollups


async def test_rollups_answer_windows_older_than_memory_and_after_a_restart(db: str) -> None:
    clock = Clock()
    a = replica(db, clock)
    recs = good(30, finish_ms=NOW_MS - 2 * MIN)
    result = await a.ingest.ingest(recs)
    assert result.accepted == 30
    recent = await a.query.query(Filters(deployment="llama"), 300)
    assert recent.source == "memory" and recent.total.requests == 30
    p50 = recent.total.ttft_ms.p50

    clock.now_ms += 3 * 3_600_000  # three hours later: far beyond the 15 minutes of memory
    later = replica(db, clock)
    await later.ingest.load()
    old = await later.query.query(Filters(deployment="llama"), 300, end_ms=NOW_MS)
    assert old.source == "rollups"
    assert old.total.requests == 30 and old.total.ttft_ms.p50 == p50
    straddle = await later.query.query(Filters(), 4 * 3600)
    assert straddle.source == "memory+rollups" and straddle.total.requests == 30
    assert (
        await later.query.query(Filters(tenant="nobody"), 300, end_ms=NOW_MS)
    ).total.requests == 0


async def test_late_record_merges_into_its_persisted_rollup(db: str) -> None:
    clock = Clock()
    a = replica(db, clock)
    await a.ingest.ingest(good(5, finish_ms=NOW_MS - MIN))
    clock.now_ms += 3_600_000  # the bucket has left memory
    before = await a.query.query(Filters(), 120, end_ms=NOW_MS)
    assert before.source == "rollups" and before.total.requests == 5  # decoded and cached
    assert (await a.ingest.ingest(good(3, "late", finish_ms=NOW_MS - MIN))).accepted == 3
    old = await a.query.query(Filters(), 120, end_ms=NOW_MS)
    assert old.total.requests == 8  # the rewritten row's new version, not the cached one


async def test_two_replicas_rollups_merge_into_one_window(db: str) -> None:
    clock = Clock()
    a, b = replica(db, clock, "a"), replica(db, clock, "b")
    recs = good(60)
    await a.ingest.ingest(recs[::2])
    await b.ingest.ingest(recs[1::2])
    await b.ingest.ingest(recs[:10])  # another replica got redeliveries: ledger says duplicate
    merged = await a.query.query(Filters(), 300)
    assert merged.source == "memory+rollups" and merged.total.requests == 60
    assert scalar(db, "SELECT count(DISTINCT replica_id) FROM telemetry.rollups") == 2


# ----------------------------------------------------------------------------- partitions


async def test_partitions_created_ahead_and_dropped_by_retention(db: str) -> None:
    clock = Clock()
    a = replica(db, clock, retention_ms=2 * DAY)
    await a.store.maintain(clock.now_ms)
    await a.ingest.ingest(good(10))
    parts = lambda: scalar(  # noqa: E731
        db,
        "SELECT count(*) FROM pg_inherits i JOIN pg_class p ON p.oid = i.inhparent "
        "WHERE p.relname = 'request_records'",
    )
    assert parts() == 4  # two days back, today, one ahead
    clock.now_ms += 4 * DAY
    done = await a.store.maintain(clock.now_ms)
    assert done["dropped"] == 4 and done["ids_deleted"] == 10 and done["rollups_deleted"] >= 1
    assert scalar(db, "SELECT count(*) FROM telemetry.request_records") == 0
    assert scalar(db, "SELECT count(*) FROM telemetry.rollups") == 0
    assert parts() == 4
    # a record the retention would already have dropped is rejected, not stored
    result = await a.ingest.ingest([record("ancient")])
    assert [why.code for _, why in result.rejected] == ["too_old"]


# ----------------------------------------------------------------------------- gRPC


@pytest.fixture
async def stub(address: str) -> AsyncIterator[telemetry_pb2_grpc.TelemetryServiceStub]:
    async with grpc.aio.insecure_channel(address) as channel:
        yield telemetry_pb2_grpc.TelemetryServiceStub(channel)


@pytest.fixture
async def address(db: str, redis_client: aioredis.Redis) -> AsyncIterator[str]:
    clock = Clock()
    r = replica(db, clock)
    from services.common.streams import DeadLetters

    dead = DeadLetters(redis_client, "tgrpc:requests", "rpc")
    server = grpc.aio.server()
    add_to_server(TelemetryServicer(r.query, r.ingest, dead=dead, wall=clock), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    yield f"127.0.0.1:{port}"
    await server.stop(None)
    await r.store.close()


async def test_report_records_mixed_batch(
    stub: telemetry_pb2_grpc.TelemetryServiceStub, db: str
) -> None:
    batch = [
        *good(5),
        record("", ttft_ms=1.0),
        record("late", finish_ms=NOW_MS + 3_600_000),
        good(1)[0],
    ]
    resp = await stub.ReportRecords(iter(batch))
    assert (resp.accepted, resp.duplicates, resp.rejected) == (5, 1, 2)
    assert [e.split(": ")[1] for e in resp.errors] == ["empty_request_id", "future"]
    again = await stub.ReportRecords(iter(good(5)))
    assert (again.accepted, again.duplicates, again.rejected) == (0, 5, 0)
    assert scalar(db, "SELECT count(*) FROM telemetry.request_records") == 5
    window = await stub.QueryWindow(
        telemetry_pb2.QueryWindowRequest(deployment="llama", window_s=300)
    )
    assert window.total.requests == 5 and window.relative_accuracy == RELATIVE_ACCURACY
    assert [s.role for s in window.slices] == ["worker"]


@pytest.mark.parametrize("window_s", [0.0, -5.0], ids=["zero", "negative"])
async def test_query_window_rejects_non_positive_window(
    stub: telemetry_pb2_grpc.TelemetryServiceStub, window_s: float
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.QueryWindow(telemetry_pb2.QueryWindowRequest(window_s=window_s))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "window_s" in (
        err.value.details() or ""
    )


async def test_get_session_turns_in_arrival_order(
    stub: telemetry_pb2_grpc.TelemetryServiceStub,
) -> None:
    turns = [
        record(
            f"t{i}", session_id="s1", arrival_ms=NOW_MS - 10_000 + 1000 * i, finish_ms=NOW_MS - 500
        )
        for i in (2, 0, 1)
    ]
    turns[0].tool_calls.add(name="search", argument_bytes=12)
    await stub.ReportRecords(iter([*turns, record("other", session_id="s2")]))
    resp = await stub.GetSession(telemetry_pb2.GetSessionRequest(session_id="s1"))
    assert [t.request_id for t in resp.turns] == ["t0", "t1", "t2"]
    assert [c.name for c in resp.turns[2].tool_calls] == ["search"]
    last = await stub.GetSession(telemetry_pb2.GetSessionRequest(session_id="s1", limit=2))
    assert [t.request_id for t in last.turns] == ["t1", "t2"]
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.GetSession(telemetry_pb2.GetSessionRequest(session_id="nope"))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


async def test_get_session_of_one_tenant(stub: telemetry_pb2_grpc.TelemetryServiceStub) -> None:
    """Session ids are the clients'; two tenants using one id see only their own turns
    when the query names the tenant (the tenant on record is the API key's)."""
    await stub.ReportRecords(
        iter(
            [
                record("a1", session_id="shared", tenant="acme", arrival_ms=NOW_MS - 3000),
                record("g1", session_id="shared", tenant="globex", arrival_ms=NOW_MS - 2000),
                record("a2", session_id="shared", tenant="acme", arrival_ms=NOW_MS - 1500),
            ]
        )
    )

    async def turns(tenant: str) -> list[str]:
        req = telemetry_pb2.GetSessionRequest(session_id="shared", tenant=tenant)
        return [t.request_id for t in (await stub.GetSession(req)).turns]

    assert await turns("") == ["a1", "g1", "a2"]  # control: the session holds both
    assert await turns("acme") == ["a1", "a2"]
    assert await turns("globex") == ["g1"]
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await turns("initech")
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


async def test_model_rpcs_unimplemented_without_a_model(
    stub: telemetry_pb2_grpc.TelemetryServiceStub,
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.GetPerfModel(telemetry_pb2.GetPerfModelRequest(deployment="llama"))
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_cli_views_read_the_service(
    stub: telemetry_pb2_grpc.TelemetryServiceStub, address: str, capsys: pytest.CaptureFixture[str]
) -> None:
    import asyncio
    import json

    from services.cli import main as cli

    await stub.ReportRecords(iter([*good(4, session_id="s9"), record("pd", disaggregated=True)]))
    args = ["--address", address]
    assert (
        await asyncio.to_thread(cli, ["get", "windows", "--deployment", "llama", "--json", *args])
        == 0
    )
    data = json.loads(capsys.readouterr().out)
    assert data["total"]["requests"] == "5" and data["source"] == "memory"
    assert await asyncio.to_thread(cli, ["get", "session", "s9", *args]) == 0
    assert "session s9: 4 turns" in capsys.readouterr().out
    assert await asyncio.to_thread(cli, ["top", "--once", *args]) == 0
    top = capsys.readouterr().out.splitlines()
    assert [line.split()[:2] for line in top[2:]] == [
        ["llama", "decode"],
        ["llama", "prefill"],
        ["llama", "worker"],
    ]
    assert await asyncio.to_thread(cli, ["get", "session", "nope", *args]) == 1
    assert "NOT_FOUND" in capsys.readouterr().err


class PoisonIngest(Ingest):
    """Fails every batch holding the record ``poison`` (a bug a record's content triggers)."""

    async def ingest(self, records: Sequence[events_pb2.RequestRecord]) -> IngestResult:
        if any(r.request_id == "poison" for r in records):
            raise ValueError("a record this store cannot take")
        return await super().ingest(records)


async def test_poison_record_is_isolated_dead_lettered_and_the_rest_stored(
    db: str, redis_client: aioredis.Redis
) -> None:
    """A record that makes its whole batch fail: the consumer isolates it, stores the
    others, and dead-letters it after max_attempts deliveries instead of retrying the read
    forever. A record Postgres could not store (a NUL in a text field) is rejected at once."""
    prefix = f"t{uuid.uuid4().hex[:8]}"
    stream = stream_name(prefix, "requests")
    batch = [*good(3), record("poison"), record("nul", tenant="a\x00b"), *good(2, "s")]
    await StreamProducer(redis_client).publish_many(stream, batch)
    rep = replica(db, Clock())
    rep.ingest.__class__ = PoisonIngest
    kw = {"prefix": prefix, "group": "telemetry", "consumer": "r1", "batch": 1000, "block_ms": 0}
    consumer = records_consumer(redis_client, rep.ingest, claim_idle_ms=0, max_attempts=2, **kw)
    await consumer.poll_once()
    assert scalar(db, "SELECT count(*) FROM telemetry.request_records") == 5
    assert (await redis_client.xpending(stream, "telemetry"))["pending"] == 1
    await consumer.poll_once()  # redelivered (delivery 2 of 2), fails again: given up
    assert (await redis_client.xpending(stream, "telemetry"))["pending"] == 0
    rows = await redis_client.xrange(stream + ":dead")
    dead = {
        events_pb2.RequestRecord.FromString(letter.fields["p"]).request_id: letter.error
        for letter in (events_pb2.DeadLetter.FromString(f[b"p"]) for _, f in rows)
    }
    assert set(dead) == {"poison", "nul"}
    assert "delivery 2" in dead["poison"] and "cannot take" in dead["poison"]
    assert dead["nul"].startswith("nul: nul_in_text: tenant")


async def test_get_tool_times_learned_from_reported_records(db: str) -> None:
    """Records reported over gRPC reach the tool-time learner once committed; GetToolTimes
    answers per tool at the asked percentiles, refuses a bad percentile, and a servicer
    without the learner answers UNIMPLEMENTED."""
    clock = Clock()
    r = replica(db, clock)
    learner = ToolTimes()
    r.ingest.observers = (learner,)
    server = grpc.aio.server()
    add_to_server(TelemetryServicer(r.query, r.ingest, tool_times=learner, wall=clock), server)
    bare = grpc.aio.server()
    add_to_server(TelemetryServicer(r.query, r.ingest, wall=clock), bare)
    port, bare_port = server.add_insecure_port("127.0.0.1:0"), bare.add_insecure_port("127.0.0.1:0")
    await server.start()
    await bare.start()
    turns = []
    for s in range(4):  # a bash call ends 2 s after arrival; the next turn 20 s later
        first = record(f"{s}a", session_id=f"s{s}", arrival_ms=NOW_MS - 60_000,
                       finish_ms=NOW_MS - 58_000)  # fmt: skip
        first.tool_calls.add(name="bash", argument_bytes=5)
        turns += [first, record(f"{s}b", session_id=f"s{s}", arrival_ms=NOW_MS - 38_000)]
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            stub = telemetry_pb2_grpc.TelemetryServiceStub(ch)
            assert (await stub.ReportRecords(iter(turns))).accepted == 8
            resp = await stub.GetToolTimes(
                telemetry_pb2.GetToolTimesRequest(deployment="llama", percentiles=[0.5, 0.9])
            )
            got = {(t.agent, t.tool): t for t in resp.tool_times}
            assert list(resp.percentiles) == [0.5, 0.9] and resp.sessions_tracked == 4
            assert got[("", "bash")].samples == 4
            assert got[("", "bash")].seconds[0] == pytest.approx(20.0, rel=0.03)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.GetToolTimes(telemetry_pb2.GetToolTimesRequest(percentiles=[2.0]))
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        async with grpc.aio.insecure_channel(f"127.0.0.1:{bare_port}") as ch:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await telemetry_pb2_grpc.TelemetryServiceStub(ch).GetToolTimes(
                    telemetry_pb2.GetToolTimesRequest(deployment="llama")
                )
            assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
    finally:
        await server.stop(None)
        await bare.stop(None)
        await r.store.close()
