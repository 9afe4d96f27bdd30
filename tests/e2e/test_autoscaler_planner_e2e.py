"""The planner scales a running stack up and down under load, through the real autoscaler
service, with no request lost on scale-in (issue 11's "Done when" e2e).

Real processes and services: the scheduler service (gRPC + OpenAI HTTP gateway following
``{prefix}:membership``), the autoscaler service as ``main.build`` wires it (Postgres for
specs and decisions, the planner loop, the seam, the reconciler over the ``local`` driver
starting simulated engines, draining through the scheduler's ``Drain``). The load signal is
the scripted TelemetryService double (``tests/helpers/telemetry_double.py``): the planner
reads 30 req/s and scales the workers out, then 0 req/s and scales them back to min. Every
decision comes from the planner loop, none is manual. Closed-loop clients keep streamed
requests in flight through the gateway the whole time, and engines are SIGKILLed 50 ms after
SIGTERM, so only the drain keeps a victim's requests from being lost: with
``drain_timeout_s=0.0001`` this test fails (6 of its streams cut, checked when written), so
the long streams (400 tokens) are what make it able to fail."""

from __future__ import annotations

import uuid
from pathlib import Path

import grpc
import pytest
from tideserve.v1 import autoscaler_pb2, autoscaler_pb2_grpc, telemetry_pb2_grpc

from services.autoscaler.drivers.settings import DriverSettings, LocalSettings
from services.autoscaler.settings import AutoscalerSettings
from services.autoscaler.translate import spec_to_proto
from services.common.planner import PlannerConfig
from services.common.planner.spec import load_spec_file
from tests.helpers.autoscale import ClosedLoop, autoscaler_service, gateway_settings
from tests.helpers.ports import free_ports, port_range
from tests.helpers.scheduler import scheduler_service
from tests.helpers.telemetry_double import ScriptedTelemetry, window
from tests.helpers.waits import eventually

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

AGG = Path(__file__).resolve().parents[2] / "deploy" / "examples" / "aggregated.yaml"


async def test_planner_scales_running_stack_under_load_and_loses_nothing(
    postgres_db_url: str, redis_url: str, tmp_path: Path
) -> None:
    prefix, deployment = f"t{uuid.uuid4().hex[:8]}", f"pl-{uuid.uuid4().hex[:6]}"
    sched_grpc, sched_http, as_port = free_ports(3)
    first, last = port_range(41)
    scheduler = f"127.0.0.1:{sched_grpc}"
    telemetry = ScriptedTelemetry()
    telemetry.window = window(0)
    tserver = grpc.aio.server()
    telemetry_pb2_grpc.add_TelemetryServiceServicer_to_server(telemetry, tserver)
    tport = tserver.add_insecure_port("127.0.0.1:0")
    await tserver.start()
    settings = AutoscalerSettings(
        grpc_port=as_port, metrics_port=0, postgres_url=postgres_db_url, redis_url=redis_url,
        stream_prefix=prefix, state_dir=tmp_path / "autoscaler", load_poll_s=0.2,
        telemetry_address=f"127.0.0.1:{tport}", hold_record_s=3600,
        planner=PlannerConfig(interval_s=0.2, predictor="constant", scale_down_window_s=0,
                              cooldown_s=0, max_scale_down_step=1.0),
        driver=DriverSettings(
            kind="local", scheduler_addresses=[scheduler], resync_s=0.5, retry_base_s=0.2,
            drain_timeout_s=30, drain_poll_s=0.05,
            local=LocalSettings(port_min=first, port_max=last, probe_interval_s=0.05,
                                state_dir=str(tmp_path / "engines"), stop_grace_s=0.05),
        ),
    )  # fmt: skip
    spec = load_spec_file(AGG.read_text()).model_copy(update={"name": deployment})
    sched = gateway_settings(redis_url, tmp_path, prefix, deployment, sched_grpc, sched_http)
    try:
        async with scheduler_service(sched), autoscaler_service(settings) as address:
            async with grpc.aio.insecure_channel(address) as channel:
                stub = autoscaler_pb2_grpc.AutoscalerServiceStub(channel)
                await stub.ApplyDeployment(
                    autoscaler_pb2.ApplyDeploymentRequest(spec=spec_to_proto(spec))
                )

                async def ready() -> int:
                    got = await stub.GetDeployment(
                        autoscaler_pb2.GetDeploymentRequest(name=deployment)
                    )
                    (role,) = got.roles
                    return int(role.ready) if got.progress == "converged" else -1

                async def at(n: int) -> bool:
                    return await ready() == n

                async def at_least(n: int) -> bool:
                    return await ready() >= n

                # no traffic: the planner holds the role at its min (1)
                await eventually(lambda: at(1), within_s=90)
                load = ClosedLoop(f"http://127.0.0.1:{sched_http}", clients=8, max_tokens=400)
                load.start()
                await eventually(lambda: _answered(load, 6), within_s=60)

                telemetry.window = window(30)  # the tide comes in
                await eventually(lambda: at_least(3), within_s=120)
                peak = await ready()
                more = len(load.outcomes) + 12
                await eventually(lambda: _answered(load, more), within_s=60)

                telemetry.window = window(0)  # and goes out
                await eventually(lambda: at(1), within_s=120)
                more = len(load.outcomes) + 6  # the last engine still serves
                await eventually(lambda: _answered(load, more), within_s=60)
                await load.stop()

                decisions = (
                    await stub.ListDecisions(
                        autoscaler_pb2.ListDecisionsRequest(deployment=deployment, limit=100)
                    )
                ).decisions
    finally:
        await tserver.stop(None)

    acted = [d for d in decisions if d.changes]
    assert acted and all(d.status == "applied" for d in acted)
    assert all(d.binding_constraint != "manual" for d in acted)
    ups = [d for d in acted if d.changes[0].to_replicas > d.changes[0].from_replicas]
    downs = [d for d in acted if d.changes[0].to_replicas < d.changes[0].from_replicas]
    assert ups and downs and all(d.victims for d in downs)
    assert peak >= 3
    # nothing lost: every request sent was answered 200 with a complete stream
    assert load.sent == len(load.outcomes) > 20
    assert load.failures() == []


async def _answered(load: ClosedLoop, n: int) -> bool:
    return len(load.outcomes) >= n
