"""QueryWindow latency over 5 minutes holding 1,000,000 records (issue 10: p99 < 50 ms).

A telemetry service process (``python -m services.telemetry``, embedded Postgres unless
--postgres-url) is filled through ``ReportRecords`` with N records finishing within the last
5 minutes (cloned from 10,000 synthetic templates: 2 deployments x 3 classes x 4 tenants,
20% disaggregated -> 72 slices), so every query's window covers all N. The service runs with
``memory_s = 60``: a 5-minute window then reads most of its buckets from the persisted
rollups (decoded and merged on each query) and only the last minute from memory — the
harder path. Then, sequentially from this process over gRPC, ``--queries`` calls each of:

* ``all_5m``: window_s=300, no filter (total + 72 slices) — the headline figure;
* ``deployment_5m``: window_s=300, deployment filter;
* ``all_1m``: window_s=60 (memory, plus the rollups query for other replicas' rows).

Run: .venv/bin/python benchmarks/telemetry_query.py --records 1000000
"""

from __future__ import annotations

import argparse
import json
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

from benchmarks._harness import ProcGroup, command_line, free_port, machine  # noqa: E402
from benchmarks._telemetry_data import infra, records  # noqa: E402

WINDOW_MS = 300_000


def clones(n: int, now_ms: int) -> Iterator[events_pb2.RequestRecord]:
    """``n`` records in finish order over the last 5 minutes (templates re-stamped)."""
    templates = records(10_000, now_ms, WINDOW_MS, seed=5, prefix="t")
    for i in range(n):
        rec = events_pb2.RequestRecord()
        rec.CopyFrom(templates[i % len(templates)])
        finish = now_ms - WINDOW_MS + 1 + (i * (WINDOW_MS - 2_000)) // n
        rec.request_id = f"q-{i}"
        rec.arrival_ms = finish - int(rec.e2e_ms)
        rec.finish_ms = finish
        yield rec


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


def fill(stub: telemetry_pb2_grpc.TelemetryServiceStub, n: int, chunk: int) -> dict[str, object]:
    now = int(time.time() * 1000)
    gen = clones(n, now)
    accepted = rejected = 0
    t0 = time.perf_counter()
    sent = 0
    while sent < n:
        size = min(chunk, n - sent)
        part = (next(gen) for _ in range(size))
        resp = stub.ReportRecords(part, timeout=600)
        accepted += resp.accepted
        rejected += resp.rejected
        sent += size
    elapsed = time.perf_counter() - t0
    return {
        "records": n,
        "accepted": accepted,
        "rejected": rejected,
        "seconds": round(elapsed, 1),
        "report_records_per_s": round(n / elapsed),
    }


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


def run(args: argparse.Namespace) -> dict[str, object]:
    with infra(args.postgres_url, "redis://unused") as inf, tempfile.TemporaryDirectory() as logs:
        group = ProcGroup(Path(logs))
        port = free_port()
        env = {"TIDESERVE_TELEMETRY__MEMORY_S": "60", "TIDESERVE_TELEMETRY__REPLICA_ID": "bench"}
        cmd = [sys.executable, "-m", "services.telemetry", "--postgres-url", inf.postgres_url,
               "--grpc-port", str(port), "--metrics-port", "0", "--log-level", "WARNING"]  # fmt: skip
        group.start("telemetry", cmd, env)
        try:
            with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = telemetry_pb2_grpc.TelemetryServiceStub(channel)
                wait_serving(stub, group)
                filled = fill(stub, args.records, args.chunk)
                out: dict[str, object] = {"fill": filled}
                for name, req in (
                    ("all_5m", telemetry_pb2.QueryWindowRequest(window_s=300)),
                    (
                        "deployment_5m",
                        telemetry_pb2.QueryWindowRequest(window_s=300, deployment="llama"),
                    ),
                    ("all_1m", telemetry_pb2.QueryWindowRequest(window_s=60)),
                ):
                    out[name] = measure(stub, req, args.queries)
                return out
        finally:
            group.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--queries", type=int, default=300, help="per scenario")
    ap.add_argument("--chunk", type=int, default=20_000, help="records per ReportRecords call")
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
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
