"""A stand-in telemetry process for the performance-model benchmarks (harness only).

Telemetry's ingest (``{prefix}:requests`` consumer group into Postgres) and its servicer's
``GetPerfModel`` are wired on other branches; until they are merged this process hosts the
model side alone: a :class:`~services.telemetry.model.service.ModelService` fed straight
from the gateway's ``{prefix}:requests`` stream (plain XREAD from the start, each record
once) and its load/membership streams, answering ``GetPerfModel`` over gRPC (other RPCs
UNIMPLEMENTED). Prints ``READY <port>`` on stdout once serving.

    .venv/bin/python benchmarks/_model_server.py --redis-url redis://127.0.0.1:6379/0 \\
        --deployment default --port 50099 --profile h200-llama3.1-8b
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import grpc
import redis.asyncio as aioredis
from tideserve.v1 import events_pb2, telemetry_pb2, telemetry_pb2_grpc

from services.common.streams import Start, StreamFollower, stream_name
from services.telemetry.model.service import ModelService
from services.telemetry.model.settings import ModelSettings

if TYPE_CHECKING:
    _Base = object
else:
    _Base = telemetry_pb2_grpc.TelemetryServiceServicer


class _NoWindows:
    """No windows on this stand-in (GetRecommendation is not served here)."""

    def window(self, deployment: str, window_s: float, now_ms: int) -> Any:
        return telemetry_pb2.QueryWindowResponse()


class _Servicer(_Base):
    def __init__(self, svc: ModelService) -> None:
        self.svc = svc

    async def GetPerfModel(self, request: Any, context: Any) -> Any:
        try:
            return self.svc.perf_model(request, int(time.time() * 1000))
        except LookupError as e:
            await context.abort(grpc.StatusCode.NOT_FOUND, str(e))


async def serve(args: argparse.Namespace) -> None:
    redis = aioredis.Redis.from_url(args.redis_url, decode_responses=False)
    settings = ModelSettings(
        profile=args.profile,
        deployments=[args.deployment],
        min_samples=args.min_samples,
        confident_samples=args.confident_samples,
        refit_interval_s=args.refit_s,
    )
    svc = ModelService(settings, windows=_NoWindows(), redis=redis, prefix=args.prefix)
    stats: dict[str, int] = {}
    follower = StreamFollower(
        redis,
        stream_name(args.prefix, "requests"),
        events_pb2.RequestRecord,
        lambda rec, _id: svc.observe_records(int(time.time() * 1000), [rec]),
        start=Start.beginning(),
        stats=stats,
        name="model-bench-requests",
    )
    server = grpc.aio.server()
    telemetry_pb2_grpc.add_TelemetryServiceServicer_to_server(_Servicer(svc), server)
    port = server.add_insecure_port(f"127.0.0.1:{args.port}")
    await server.start()
    await svc.start()
    follower.start()
    print(f"READY {port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await follower.stop()
    await svc.stop()
    await server.stop(1.0)
    await redis.aclose()
    print(f"STATS {stats}", file=sys.stderr, flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--redis-url", required=True)
    p.add_argument("--prefix", default="ts")
    p.add_argument("--deployment", default="default")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--profile", default="h200-llama3.1-8b", help="the prior")
    p.add_argument("--min-samples", type=int, default=50)
    p.add_argument("--confident-samples", type=int, default=50)
    p.add_argument("--refit-s", type=float, default=2.0)
    asyncio.run(serve(p.parse_args()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
