"""QueryWindow latency over 5 minutes holding 1,000,000 records (target: p99 < 50 ms).

1. Fill: N records finishing within a 290-second span (cloned from 10,000 synthetic
   templates: 2 deployments x 3 classes x 4 tenants, 20% disaggregated -> 72 slices) go
   through the ingest path in this process (``Ingest.ingest``: ledger, COPY into the
   partitioned table, rollups), into an embedded Postgres (or --postgres-url).
2. A telemetry service process (``python -m services.telemetry``, same replica id) starts,
   loads its rollups and answers ``--queries`` sequential QueryWindow calls over gRPC per
   scenario, all with ``end_ms`` = the end of the fill span so each 5-minute window covers
   all N records:
   * ``all_5m``: window_s=300, no filter (total + 72 slices) — the headline figure;
   * ``deployment_5m``: window_s=300, one deployment (36 slices).
   Run twice: ``memory`` (default ``memory_s`` = 900: buckets from memory, plus the
   query for other replicas' rollup rows) and ``rollups`` (restarted with ``memory_s`` = 60:
   every bucket of the window decoded from the rollups table on each query).

Run: .venv/bin/python benchmarks/telemetry_query.py --records 1000000
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

sys.path[:0] = [
    str(Path(__file__).resolve().parents[1]),
    str(Path(__file__).resolve().parents[1] / "proto"),
]

import grpc  # noqa: E402
from tideserve.v1 import events_pb2, telemetry_pb2, telemetry_pb2_grpc  # noqa: E402

from benchmarks._harness import ProcGroup, command_line, emit_json, free_port, machine  # noqa: E402
from benchmarks._telemetry_data import infra, records  # noqa: E402
from services.common.db import migrate  # noqa: E402
from services.telemetry.ingest.pipeline import Ingest  # noqa: E402
from services.telemetry.main import new_memory  # noqa: E402
from services.telemetry.settings import TelemetrySettings  # noqa: E402
from services.telemetry.store.pg import RecordStore  # noqa: E402
from services.telemetry.windows.bucket import RELATIVE_ACCURACY  # noqa: E402
from services.telemetry.windows.validate import ValidationRules  # noqa: E402

SPAN_MS = 290_000
REPLICA = "bench"


def clones(n: int, end_ms: int) -> Iterator[events_pb2.RequestRecord]:
    """``n`` records in finish order over ``[end - 290 s, end)`` (templates re-stamped)."""
    templates = records(10_000, end_ms, SPAN_MS, seed=5, prefix="t")
    for i in range(n):
        rec = events_pb2.RequestRecord()
        rec.CopyFrom(templates[i % len(templates)])
        finish = end_ms - SPAN_MS + (i * SPAN_MS) // n
        rec.request_id = f"q-{i}"
        rec.arrival_ms = finish - int(rec.e2e_ms)
        rec.finish_ms = finish
        yield rec


async def fill(url: str, n: int, end_ms: int) -> dict[str, object]:
    settings = TelemetrySettings(replica_id=REPLICA)
    store = RecordStore(
        url,
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
        replica_id=REPLICA,
        wall=time.time,
    )
    await asyncio.to_thread(migrate, url, "telemetry")
    await store.maintain(end_ms)
    gen = clones(n, end_ms)
    accepted = 0
    t0 = time.perf_counter()
    while True:
        batch = list(itertools.islice(gen, settings.ingest_batch))
        if not batch:
            break
        accepted += (await ingest.ingest(batch)).accepted
    elapsed = time.perf_counter() - t0
    await store.close()
    return {"records": n, "accepted": accepted, "seconds": round(elapsed, 1)}


def wait_serving(stub: telemetry_pb2_grpc.TelemetryServiceStub, group: ProcGroup) -> None:
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        group.check()
        try:
            stub.QueryWindow(telemetry_pb2.QueryWindowRequest(window_s=60), timeout=2)
            return
        except grpc.RpcError:
            time.sleep(0.5)
    raise RuntimeError("telemetry did not answer within 90 s")


def measure(
    stub: telemetry_pb2_grpc.TelemetryServiceStub,
    req: telemetry_pb2.QueryWindowRequest,
    queries: int,
) -> dict[str, object]:
    lat: list[float] = []
    resp = None
    for _ in range(queries):
        t0 = time.perf_counter()
        resp = stub.QueryWindow(req, timeout=30)
        lat.append((time.perf_counter() - t0) * 1000)
    assert resp is not None
    lat.sort()
    return {
        "queries": queries,
        "requests_in_window": resp.total.requests,
        "slices": len(resp.slices),
        "source": resp.source,
        "p50_ms": round(statistics.median(lat), 2),
        "p99_ms": round(lat[max(0, int(len(lat) * 0.99) - 1)], 2),
        "max_ms": round(lat[-1], 2),
    }


def serve_and_measure(url: str, memory_s: int, end_ms: int, queries: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as logs:
        group = ProcGroup(Path(logs))
        port = free_port()
        env = {
            "TIDESERVE_TELEMETRY__MEMORY_S": str(memory_s),
            "TIDESERVE_TELEMETRY__REPLICA_ID": REPLICA,
        }
        cmd = [sys.executable, "-m", "services.telemetry", "--postgres-url", url,
               "--grpc-port", str(port), "--metrics-port", "0", "--log-level", "WARNING"]  # fmt: skip
        group.start("telemetry", cmd, env)
        try:
            with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = telemetry_pb2_grpc.TelemetryServiceStub(channel)
                wait_serving(stub, group)
                return {
                    name: measure(stub, req, queries)
                    for name, req in (
                        ("all_5m", telemetry_pb2.QueryWindowRequest(window_s=300, end_ms=end_ms)),
                        (
                            "deployment_5m",
                            telemetry_pb2.QueryWindowRequest(
                                window_s=300, end_ms=end_ms, deployment="llama"
                            ),
                        ),
                    )
                }
        finally:
            group.stop()


def run(args: argparse.Namespace) -> dict[str, object]:
    with infra(args.postgres_url, "redis://unused") as inf:
        end_ms = int(time.time() * 1000)
        end_ms -= end_ms % 60_000  # the window [end - 300 s, end) is 5 whole buckets
        out: dict[str, object] = {"fill": asyncio.run(fill(inf.postgres_url, args.records, end_ms))}
        out["memory"] = serve_and_measure(inf.postgres_url, 900, end_ms, args.queries)
        out["rollups"] = serve_and_measure(inf.postgres_url, 60, end_ms, args.queries)
        return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--queries", type=int, default=200, help="per scenario")
    ap.add_argument("--postgres-url", default=None, help="default: embedded, in a temp dir")
    ap.add_argument("--out", default=None, help="also write the JSON here")
    args = ap.parse_args()
    result = {
        "benchmark": "telemetry_query",
        "command": command_line(),
        "machine": machine(),
        "target_p99_ms": 50,
        **run(args),
    }
    emit_json(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
