"""The telemetry service as ``main.build`` wires it (real Postgres and Redis): records
reported over gRPC reach the fitted model through the ingest's observer, and GetPerfModel /
GetRecommendation answer from the model side over the same windows QueryWindow reads."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest
from tideserve.v1 import common_pb2, telemetry_pb2, telemetry_pb2_grpc

from services.common.db import migrate
from services.telemetry.main import build
from services.telemetry.model.settings import ModelSettings
from services.telemetry.settings import TelemetrySettings
from tests.helpers.records import NOW_MS, record

pytestmark = pytest.mark.integration


@pytest.fixture
async def stub(postgres_db_url: str, redis_url: str) -> AsyncIterator[object]:
    migrate(postgres_db_url, "telemetry")
    settings = TelemetrySettings(
        postgres_url=postgres_db_url,
        redis_url=redis_url,
        stream_prefix="tsvc",
        deployments=["llama"],
        model=ModelSettings(deployments=["llama"], min_samples=10, refit_interval_s=0.001),
    )
    ticks = iter(range(10**9))  # a wall clock that moves 1 ms a call (refits are timed)
    hooks = build(settings, wall=lambda: (NOW_MS + next(ticks)) / 1000)
    server = grpc.aio.server()
    hooks.register(server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    assert hooks.on_start is not None and hooks.on_stop is not None
    await hooks.on_start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            yield telemetry_pb2_grpc.TelemetryServiceStub(ch)
    finally:
        await hooks.on_stop()
        await server.stop(None)


def _records(n: int) -> list[object]:
    # TTFT grows with the uncached tokens: the fit has something to learn
    return [
        record(
            f"m{i}",
            prompt_tokens=1000 + 200 * i,
            cached_tokens=0,
            ttft_ms=50.0 + 0.1 * (1000 + 200 * i),
            queue_ms=0.0,
            finish_ms=NOW_MS - 1_000 - i,
        )
        for i in range(n)
    ]


async def test_model_side_is_wired_by_default(
    stub: telemetry_pb2_grpc.TelemetryServiceStub,
) -> None:
    before = await stub.GetPerfModel(telemetry_pb2.GetPerfModelRequest(deployment="llama"))
    assert before.model.samples == 0  # the prior alone
    resp = await stub.ReportRecords(iter(_records(40)))
    assert resp.accepted == 40
    after = await stub.GetPerfModel(
        telemetry_pb2.GetPerfModelRequest(deployment="llama", role=common_pb2.ROLE_WORKER)
    )
    assert after.model.samples > 0  # the committed records reached the fit
    rec = await stub.GetRecommendation(
        telemetry_pb2.GetRecommendationRequest(deployment="llama", window_s=300)
    )
    assert rec.worker_replicas >= 1 and rec.binding_constraint and rec.request_rate_rps > 0
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.GetPerfModel(telemetry_pb2.GetPerfModelRequest(deployment="nope"))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
