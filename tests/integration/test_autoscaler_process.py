"""The autoscaler wired by ``main.build`` and run by the common runner: migrations, RPCs and
the planner loop as a task, against real Postgres and a scripted TelemetryService."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest
from tideserve.v1 import autoscaler_pb2, autoscaler_pb2_grpc, telemetry_pb2_grpc

from services.autoscaler.main import build
from services.autoscaler.settings import AutoscalerSettings
from services.autoscaler.translate import spec_to_proto
from services.common.planner import PlannerConfig
from services.common.planner.ports import InMemoryReconciler
from services.common.planner.spec import load_spec_file
from services.common.server import serve
from tests.helpers.ports import free_port
from tests.helpers.telemetry_double import ScriptedTelemetry, window
from tests.helpers.waits import eventually

pytestmark = pytest.mark.integration

PD = Path(__file__).resolve().parents[2] / "deploy" / "examples" / "pd.yaml"


async def test_built_service_plans_on_its_own(postgres_db_url: str) -> None:
    telemetry = ScriptedTelemetry()
    telemetry.window = window(30)
    tserver = grpc.aio.server()
    telemetry_pb2_grpc.add_TelemetryServiceServicer_to_server(telemetry, tserver)
    tport = tserver.add_insecure_port("127.0.0.1:0")
    await tserver.start()
    reconciler = InMemoryReconciler()
    port = free_port()
    settings = AutoscalerSettings(
        grpc_port=port,
        metrics_port=0,
        postgres_url=postgres_db_url,
        telemetry_address=f"127.0.0.1:{tport}",
        planner=PlannerConfig(interval_s=0.05, predictor="constant"),
        hold_record_s=3600,
    )
    hooks = build(settings, lambda _s: reconciler)
    ready, stop = asyncio.Event(), asyncio.Event()
    from services.common import db

    await asyncio.to_thread(db.migrate, postgres_db_url, "autoscaler")  # the runner's job
    task = asyncio.create_task(
        serve(settings, "autoscaler", hooks.register, on_start=hooks.on_start,
              on_stop=hooks.on_stop, ready=ready, stop=stop, registry=hooks.registry)
    )  # fmt: skip
    try:
        await asyncio.wait_for(ready.wait(), 30)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = autoscaler_pb2_grpc.AutoscalerServiceStub(channel)
            spec = spec_to_proto(load_spec_file(PD.read_text()))
            await stub.ApplyDeployment(autoscaler_pb2.ApplyDeploymentRequest(spec=spec))

            async def scaled() -> bool:
                got = await stub.ListDecisions(
                    autoscaler_pb2.ListDecisionsRequest(deployment="chat-pd")
                )
                return any(d.status == "applied" for d in got.decisions)

            await eventually(scaled)
        # apply hands the spec's replicas over, then the planner's first decision
        assert [c[1] for c in reconciler.calls[:2]] == [
            {"prefill": 1, "decode": 1},
            {"prefill": 4, "decode": 3},
        ]
    finally:
        stop.set()
        await asyncio.wait_for(task, 60)
        await tserver.stop(None)
