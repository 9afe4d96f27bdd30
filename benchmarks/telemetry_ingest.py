"""Telemetry ingest throughput into Postgres (target: >= 20,000 records/s sustained).

Two figures, on an embedded Postgres + Redis (or --postgres-url/--redis-url):

* ``end_to_end``: N records are XADDed to ``ts:requests`` beforehand; then the telemetry
  service's own composition (``services.telemetry.main.build``, started with its on_start
  hook) drains the stream: XREADGROUP -> decode -> validate -> one transaction per batch
  (ledger insert, COPY, rollup upserts) -> commit -> windows -> XACK. The clock runs from
  on_start until every entry is acknowledged (none pending, the group's last delivered id =
  the stream's last id) — records/s acknowledged after commit.
* ``writer``: the same ``Ingest.ingest`` path on already decoded records, in batches, without
  Redis — what the database writer (+ validation + windows + rollups) sustains alone.

Each figure also reports ``process_cpu_s``: CPU seconds this process spent over the timed
span (the service's Python work; Postgres and Redis run in their own processes). On a shared
machine the rate swings with the load; CPU per record is the steadier measure of the code.

Run: .venv/bin/python benchmarks/telemetry_ingest.py --records 200000
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

sys.path[:0] = [
    str(Path(__file__).resolve().parents[1]),
    str(Path(__file__).resolve().parents[1] / "proto"),
]

import psycopg  # noqa: E402
import redis.asyncio as aioredis  # noqa: E402

from benchmarks._harness import command_line, emit_json, machine  # noqa: E402
from benchmarks._telemetry_data import infra, records  # noqa: E402
from services.common.db import migrate, to_libpq_url  # noqa: E402
from services.common.streams import StreamProducer, stream_name  # noqa: E402
from services.telemetry.ingest.pipeline import Ingest  # noqa: E402
from services.telemetry.main import build, new_memory  # noqa: E402
from services.telemetry.settings import TelemetrySettings  # noqa: E402
from services.telemetry.store.pg import RecordStore  # noqa: E402
from services.telemetry.windows.bucket import RELATIVE_ACCURACY  # noqa: E402
from services.telemetry.windows.validate import ValidationRules  # noqa: E402


def count(url: str, table: str) -> int:
    with psycopg.connect(to_libpq_url(url)) as conn:
        row = conn.execute(f"SELECT count(*) FROM telemetry.{table}").fetchone()
    return int(row[0]) if row else 0


def reset(url: str) -> None:
    with psycopg.connect(to_libpq_url(url), autocommit=True) as conn:
        conn.execute("DROP SCHEMA IF EXISTS telemetry CASCADE")
    migrate(url, "telemetry")


async def end_to_end(pg: str, rd: str, n: int, batch: int) -> dict[str, object]:
    reset(pg)
    client = aioredis.from_url(rd)
    prefix = f"bench{int(time.time())}"
    stream = stream_name(prefix, "requests")
    recs = records(n, int(time.time() * 1000), 600_000, seed=2, prefix="e2e")
    producer = StreamProducer(client, maxlen=n * 2)
    for i in range(0, n, 5000):
        await producer.publish_many(stream, recs[i : i + 5000])
    last_id = (await client.xinfo_stream(stream))["last-generated-id"]
    settings = TelemetrySettings(
        postgres_url=pg,
        redis_url=rd,
        stream_prefix=prefix,
        replica_id="bench",
        grpc_port=0,
        metrics_port=0,
        ingest_batch=batch,
        ingest_block_ms=100,
    )
    hooks = build(settings)
    t0, c0 = time.perf_counter(), time.process_time()
    assert hooks.on_start is not None and hooks.on_stop is not None
    await hooks.on_start()
    try:
        while True:
            groups = await client.xinfo_groups(stream)
            if groups and groups[0]["last-delivered-id"] == last_id and not groups[0]["pending"]:
                break
            await asyncio.sleep(0.05)
        elapsed = time.perf_counter() - t0
        cpu = time.process_time() - c0
    finally:
        await hooks.on_stop()
        await client.aclose()
    stored = count(pg, "request_records")
    return {
        "records": n,
        "stored": stored,
        "batch": batch,
        "seconds": round(elapsed, 2),
        "records_per_s": round(n / elapsed),
        "process_cpu_s": round(cpu, 2),
    }


async def writer(pg: str, n: int, batch: int, profile: bool) -> dict[str, object]:
    reset(pg)
    settings = TelemetrySettings(replica_id="bench-writer")
    now = int(time.time() * 1000)
    recs = records(n, now, 600_000, seed=3, prefix="w")
    store = RecordStore(
        pg,
        partition_ms=settings.partition_s * 1000,
        retention_ms=settings.retention_s * 1000,
        rollup_retention_ms=settings.rollup_retention_s * 1000,
        ahead=settings.partitions_ahead,
        accuracy=RELATIVE_ACCURACY,
    )
    ingest = Ingest(
        store,
        new_memory(settings),
        rules=ValidationRules.of((), 60_000, settings.retention_s * 1000),
        classes=settings.classes(),
        replica_id="bench-writer",
        wall=time.time,
    )
    await store.maintain(now)
    prof = cProfile.Profile() if profile else None
    t0, c0 = time.perf_counter(), time.process_time()
    if prof:
        prof.enable()
    accepted = 0
    for i in range(0, n, batch):
        accepted += (await ingest.ingest(recs[i : i + batch])).accepted
    if prof:
        prof.disable()
    elapsed = time.perf_counter() - t0
    cpu = time.process_time() - c0
    await store.close()
    out: dict[str, object] = {
        "records": n,
        "accepted": accepted,
        "batch": batch,
        "seconds": round(elapsed, 2),
        "records_per_s": round(n / elapsed),
        "process_cpu_s": round(cpu, 2),
    }
    if prof:
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(12)
        out["profile_top_tottime"] = s.getvalue().splitlines()[-20:]
    return out


async def amain(args: argparse.Namespace) -> dict[str, object]:
    with infra(args.postgres_url, args.redis_url) as inf:
        result: dict[str, object] = {}
        result["writer"] = await writer(inf.postgres_url, args.records, args.batch, args.profile)
        result["end_to_end"] = await end_to_end(
            inf.postgres_url, inf.redis_url, args.records, args.batch
        )
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--batch", type=int, default=5000, help="records per transaction")
    ap.add_argument("--postgres-url", default=None, help="default: embedded, in a temp dir")
    ap.add_argument("--redis-url", default=None, help="default: embedded, in a temp dir")
    ap.add_argument("--profile", action="store_true", help="cProfile the writer run")
    ap.add_argument("--out", default=None, help="also write the JSON here")
    args = ap.parse_args()
    out = {
        "benchmark": "telemetry_ingest",
        "command": command_line(),
        "machine": machine(),
        "target_records_per_s": 20_000,
        **asyncio.run(amain(args)),
    }
    emit_json(out, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
