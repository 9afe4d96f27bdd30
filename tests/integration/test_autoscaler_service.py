"""The autoscaler's RPCs and planner loop against real Postgres, a scripted in-process
``TelemetryService`` (grpc.aio, our own test double) and the in-memory reconciler fake."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from prometheus_client import CollectorRegistry
from tideserve.v1 import (
    autoscaler_pb2,
    autoscaler_pb2_grpc,
    common_pb2,
    telemetry_pb2_grpc,
)

from services.autoscaler.deployments import Deployments
from services.autoscaler.loop import LoopOptions, PlannerLoop
from services.autoscaler.metrics import AutoscalerMetrics
from services.autoscaler.scope import EVERY, Scope
from services.autoscaler.servicer import AutoscalerServicer, add_to_server
from services.autoscaler.store import AutoscalerStore
from services.autoscaler.telemetry import GrpcTelemetry
from services.autoscaler.translate import spec_to_proto
from services.cli import main as cli
from services.common.db import create_engine, migrate
from services.common.planner import PlannerConfig
from services.common.planner.ports import InMemoryReconciler
from services.common.planner.spec import PlannerSpec, load_spec_file
from tests.helpers.telemetry_double import ScriptedTelemetry, window

pytestmark = pytest.mark.integration

PD = Path(__file__).resolve().parents[2] / "deploy" / "examples" / "pd.yaml"


@dataclass
class Harness:
    stub: Any
    telemetry: ScriptedTelemetry
    reconciler: InMemoryReconciler
    loop: PlannerLoop
    registry: CollectorRegistry
    address: str = ""
    clock: list[float] = field(default_factory=lambda: [0.0])


async def _harness(url: str, advisory: bool, scope: Scope = EVERY) -> AsyncIterator[Harness]:
    await asyncio.to_thread(migrate, url, "autoscaler")
    engine = create_engine(url, "autoscaler")
    telemetry = ScriptedTelemetry()
    tserver = grpc.aio.server()
    telemetry_pb2_grpc.add_TelemetryServiceServicer_to_server(telemetry, tserver)
    tport = tserver.add_insecure_port("127.0.0.1:0")
    await tserver.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{tport}")
    store = AutoscalerStore(engine)
    reconciler = InMemoryReconciler()
    registry = CollectorRegistry()
    clock = [0.0]
    cfg = PlannerConfig(predictor="constant", scale_down_window_s=60, cooldown_s=0)
    loop = PlannerLoop(
        store,
        reconciler,
        GrpcTelemetry(channel),
        cfg,
        LoopOptions(advisory=advisory, hold_record_s=0, scope=scope),
        AutoscalerMetrics(registry),
        clock=lambda: clock[0],
        wall=lambda: 1_700_000_000 + clock[0],
    )
    deployments = Deployments(
        store, reconciler, loop, advisory=advisory, wall=lambda: clock[0], scope=scope
    )
    server = grpc.aio.server()
    add_to_server(AutoscalerServicer(deployments, lambda: int(clock[0] * 1000)), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    client = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        h = Harness(
            autoscaler_pb2_grpc.AutoscalerServiceStub(client), telemetry, reconciler, loop, registry
        )
        h.clock = clock
        h.address = f"127.0.0.1:{port}"
        yield h
    finally:
        await client.close()
        await server.stop(None)
        await channel.close()
        await tserver.stop(None)
        await engine.dispose()


@pytest.fixture
async def h(postgres_db_url: str) -> AsyncIterator[Harness]:
    async for x in _harness(postgres_db_url, advisory=False):
        yield x


@pytest.fixture
async def advisory(postgres_db_url: str) -> AsyncIterator[Harness]:
    async for x in _harness(postgres_db_url, advisory=True):
        yield x


@pytest.fixture
async def scoped(postgres_db_url: str) -> AsyncIterator[Harness]:
    async for x in _harness(postgres_db_url, advisory=False, scope=Scope(("chat-*",))):
        yield x


async def _apply(h: Harness, **update: Any) -> Any:
    spec = spec_to_proto(load_spec_file(PD.read_text()).model_copy(update=update))
    return await h.stub.ApplyDeployment(autoscaler_pb2.ApplyDeploymentRequest(spec=spec))


async def _scale(h: Harness, role: str, replicas: int = 0, release: bool = False) -> Any:
    req = autoscaler_pb2.ScaleRoleRequest(
        deployment="chat-pd", role=role, replicas=replicas, pin=not release, release=release
    )
    return (await h.stub.ScaleRole(req)).decision


async def test_apply_validates_and_is_idempotent(h: Harness) -> None:
    bad = spec_to_proto(load_spec_file(PD.read_text()))
    bad.roles[0].min_replicas = 9
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await h.stub.ApplyDeployment(autoscaler_pb2.ApplyDeploymentRequest(spec=bad))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "roles[0]: min_replicas (9) > max_replicas (6)" in (info.value.details() or "")
    first, again = await _apply(h), await _apply(h)
    assert (first.changed, first.spec.generation) == (True, 1)
    assert (again.changed, again.spec.generation) == (False, 1)
    listed = await h.stub.ListDeployments(autoscaler_pb2.ListDeploymentsRequest())
    assert [d.name for d in listed.deployments] == ["chat-pd"]


async def test_loop_scales_up_stores_decisions_and_exports_metrics(h: Harness) -> None:
    await _apply(h)
    h.telemetry.window = window(30)
    stored = await h.loop.tick()
    assert [r.status for r in stored] == ["applied"]
    assert h.reconciler.calls[-1][1] == {"prefill": 4, "decode": 3}
    got = await h.stub.GetDeployment(autoscaler_pb2.GetDeploymentRequest(name="chat-pd"))
    assert {(r.role, r.desired, r.ready) for r in got.roles} == {
        ("prefill", 4, 4),
        ("decode", 3, 3),
    }
    decision = got.recent_decisions[0]
    assert "prefill:ttft:interactive" in decision.binding_constraint
    assert any(r.startswith("prefill: 1 -> 4 (up)") for r in decision.reasons)
    assert '"rate_rps": 30.0' in decision.inputs_json
    assert '"predictor": "constant"' in decision.forecast_json
    assert h.telemetry.queries[-1].deployment == "chat-pd"
    sample = h.registry.get_sample_value
    assert (
        sample(
            "tideserve_autoscaler_replicas",
            {"deployment": "chat-pd", "role": "prefill", "state": "desired"},
        )
        == 4
    )
    assert (
        sample(
            "tideserve_autoscaler_decisions_total",
            {"deployment": "chat-pd", "role": "prefill", "direction": "up"},
        )
        == 1
    )


async def test_a_specs_planner_section_overrides_the_autoscalers_policy(h: Harness) -> None:
    await _apply(h, planner=PlannerSpec(policy="reactive"))
    h.telemetry.window = window(30)
    await h.loop.tick()
    got = await h.stub.GetDeployment(autoscaler_pb2.GetDeploymentRequest(name="chat-pd"))
    assert got.spec.planner.policy == "reactive"
    assert "reactive" in got.recent_decisions[0].binding_constraint


async def test_telemetry_outage_holds_and_says_so(h: Harness) -> None:
    await _apply(h)
    h.telemetry.window = window(30)
    await h.loop.tick()
    calls = len(h.reconciler.calls)
    h.telemetry.down = True
    h.clock[0] = 100.0
    stored = await h.loop.tick()
    assert stored and stored[0].binding_constraint == "telemetry-outage"
    assert "telemetry unavailable" in stored[0].reasons[0]
    assert "telemetry is down" in stored[0].reasons[0]
    assert h.reconciler.calls[-1][1] == {"prefill": 4, "decode": 3}
    assert len(h.reconciler.calls) == calls  # no new call


async def test_scale_in_names_victims_and_reconciler_removes_them(h: Harness) -> None:
    await _apply(h)
    h.telemetry.window = window(30)
    await h.loop.tick()
    h.telemetry.window = window(0)
    for t in (30.0, 61.0, 62.0, 63.0, 64.0):
        h.clock[0] = t
        await h.loop.tick()
    got = await h.stub.GetDeployment(autoscaler_pb2.GetDeploymentRequest(name="chat-pd"))
    assert {(r.role, r.desired, r.ready) for r in got.roles} == {
        ("prefill", 1, 1),
        ("decode", 1, 1),
    }
    downs = [d for d in got.recent_decisions if any("(down)" in r for r in d.reasons)]
    assert downs and all(d.victims for d in downs)


async def test_plan_scale_and_delete(h: Harness) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await h.stub.Plan(autoscaler_pb2.PlanRequest(deployment="nope"))
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    await _apply(h)
    h.telemetry.window = window(30)
    handed = list(h.reconciler.calls)  # apply hands the spec's replicas over
    assert handed == [("chat-pd", {"prefill": 1, "decode": 1}, ())]
    plan = await h.stub.Plan(autoscaler_pb2.PlanRequest(deployment="chat-pd"))
    assert plan.decision.status == "plan"
    assert {(c.role, c.to_replicas) for c in plan.decision.changes} == {
        ("prefill", 4),
        ("decode", 3),
    }
    assert h.reconciler.calls == handed  # Plan changes nothing
    for role, n, code in (
        ("prefill", 7, grpc.StatusCode.FAILED_PRECONDITION),
        ("router", 1, grpc.StatusCode.NOT_FOUND),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await h.stub.ScaleRole(
                autoscaler_pb2.ScaleRoleRequest(deployment="chat-pd", role=role, replicas=n)
            )
        assert info.value.code() == code
    scaled = await h.stub.ScaleRole(
        autoscaler_pb2.ScaleRoleRequest(deployment="chat-pd", role="decode", replicas=2)
    )
    assert (scaled.decision.status, scaled.decision.binding_constraint) == ("applied", "manual")
    instances = await h.stub.ListInstances(
        autoscaler_pb2.ListInstancesRequest(deployment="chat-pd")
    )
    assert sorted((i.role, i.state, i.labels["role_name"]) for i in instances.instances) == [
        (common_pb2.ROLE_PREFILL, common_pb2.INSTANCE_STATE_READY, "prefill"),
        (common_pb2.ROLE_DECODE, common_pb2.INSTANCE_STATE_READY, "decode"),
        (common_pb2.ROLE_DECODE, common_pb2.INSTANCE_STATE_READY, "decode"),
    ]
    await h.stub.DeleteDeployment(autoscaler_pb2.DeleteDeploymentRequest(name="chat-pd"))
    await h.stub.DeleteDeployment(autoscaler_pb2.DeleteDeploymentRequest(name="chat-pd"))
    assert h.reconciler.instances("chat-pd") == []
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await h.stub.GetDeployment(autoscaler_pb2.GetDeploymentRequest(name="chat-pd"))
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


async def test_a_manual_scale_pins_until_released_or_a_changed_apply(h: Harness) -> None:
    await _apply(h)
    h.telemetry.window = window(30)  # the planner wants prefill 4, decode 3
    unpinned = await h.stub.ScaleRole(
        autoscaler_pb2.ScaleRoleRequest(deployment="chat-pd", role="decode", replicas=2)
    )
    assert unpinned.decision.reasons == ["manual: decode 1 -> 2"]
    h.clock[0] = 0.5
    await h.loop.tick()  # not pinned: a starting count the planner moves
    assert h.reconciler.calls[-1][1] == {"prefill": 4, "decode": 3}
    pinned = await _scale(h, "decode", 2)
    assert pinned.reasons == ["manual: decode 3 -> 2, pinned"]
    (tick,) = await h.loop.tick()
    assert h.reconciler.calls[-1][1] == {"prefill": 4, "decode": 2}
    assert "manual pin: decode 2" in tick.reasons[-1] and "manual" in tick.binding_constraint
    released = await _scale(h, "decode", release=True)
    assert released.reasons == ["manual: decode released (was pinned at 2)"]
    assert not released.changes
    h.clock[0] = 1.0
    await h.loop.tick()
    assert h.reconciler.calls[-1][1] == {"prefill": 4, "decode": 3}
    await _scale(h, "decode", 1)
    calls = len(h.reconciler.calls)
    h.clock[0] = 2.0
    (held,) = await h.loop.tick()  # held at the pin: nothing to do
    assert (held.changes, len(h.reconciler.calls)) == ((), calls)
    await _apply(h, perf_profile="")  # a changed spec (generation 2) clears the pins
    h.clock[0] = 3.0
    await h.loop.tick()
    assert h.reconciler.calls[-1][1]["decode"] == 3
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await _scale(h, "router", release=True)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


async def test_scope_limits_what_this_autoscaler_drives(scoped: Harness) -> None:
    """``managed_deployments: [chat-*]`` on a Postgres shared with another stack's
    ``other-pd``: both stored, only ``chat-pd`` handed over, resumed, planned or scaled."""
    await _apply(scoped)
    await _apply(scoped, name="other-pd")
    assert [c[0] for c in scoped.reconciler.calls] == ["chat-pd"]
    got = await scoped.stub.GetDeployment(autoscaler_pb2.GetDeploymentRequest(name="other-pd"))
    assert got.spec.name == "other-pd"  # stored, listed, described
    scoped.telemetry.window = window(30)
    stored = await scoped.loop.tick()
    assert [r.deployment for r in stored] == ["chat-pd"]
    assert await scoped.loop._store.get("other-pd") is not None
    for call in (
        scoped.stub.ScaleRole(
            autoscaler_pb2.ScaleRoleRequest(deployment="other-pd", role="decode", replicas=2)
        ),
        scoped.stub.Plan(autoscaler_pb2.PlanRequest(deployment="other-pd")),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "not managed by this autoscaler (managed_deployments: chat-*)" in (
            info.value.details() or ""
        )
    before = len(scoped.reconciler.calls)
    deployments = Deployments(
        scoped.loop._store, scoped.reconciler, scoped.loop, advisory=False,
        wall=lambda: 0.0, scope=Scope(("chat-*",)),
    )  # fmt: skip
    assert await deployments.resume() == 1
    assert [c[0] for c in scoped.reconciler.calls[before:]] == ["chat-pd"]
    await scoped.stub.DeleteDeployment(autoscaler_pb2.DeleteDeploymentRequest(name="other-pd"))
    assert all(c[0] == "chat-pd" for c in scoped.reconciler.calls)


async def test_advisory_mode_records_dry_run_and_changes_nothing(advisory: Harness) -> None:
    await _apply(advisory)
    advisory.telemetry.window = window(30)
    stored = await advisory.loop.tick()
    assert [r.status for r in stored] == ["dry-run"]
    assert advisory.reconciler.calls == []
    listed = await advisory.stub.ListDecisions(
        autoscaler_pb2.ListDecisionsRequest(deployment="chat-pd", limit=5)
    )
    assert [d.status for d in listed.decisions] == ["dry-run"]


async def _cli(h: Harness, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``tideserve ARGV --autoscaler <h>`` in a thread: (exit code, stdout, stderr)."""
    code = await asyncio.to_thread(cli, [*argv, "--autoscaler", h.address])
    out, err = capsys.readouterr()
    return code, out, err


async def test_cli_apply_get_describe_plan(h: Harness, capsys: pytest.CaptureFixture[str]) -> None:
    def run(*argv: str) -> Any:
        return _cli(h, capsys, *argv)

    assert await run("apply", "-f", str(PD)) == (
        0,
        "deployment chat-pd configured (generation 1)\n",
        "",
    )
    code, out, _ = await run("apply", "-f", str(PD), "--json")
    assert code == 0 and json.loads(out)["changed"] is False
    h.telemetry.window = window(30)
    await h.loop.tick()
    code, out, _ = await run("get", "deployments")
    assert code == 0 and "chat-pd" in out and "prefill=4/4" in out
    code, out, _ = await run("get", "deployments", "--json")
    assert json.loads(out)["deployments"][0]["spec"]["name"] == "chat-pd"
    code, out, _ = await run("describe", "deployment", "chat-pd")
    assert code == 0
    assert "prefill" in out and "[applied]" in out and "prefill: 1 -> 4 (up)" in out
    code, out, _ = await run("plan", "--deployment", "chat-pd", "--json")
    assert code == 0 and json.loads(out)["status"] == "plan"
    code, out, err = await run("describe", "deployment", "nope")
    assert code == 1 and "NOT_FOUND" in err
    bad = PD.parent.parent.parent / "pyproject.toml"
    code, _, err = await run("apply", "-f", str(bad))
    assert code == 1 and "invalid spec" in err


async def test_cli_scale_pins_and_releases(h: Harness, capsys: pytest.CaptureFixture[str]) -> None:
    def run(*argv: str) -> Any:
        return _cli(h, capsys, *argv)

    await _apply(h)
    code, out, _ = await run("scale", "deployment", "chat-pd", "--role", "decode",
                             "--replicas", "2", "--json")  # fmt: skip
    doc = json.loads(out)
    assert code == 0 and (doc["status"], doc["binding_constraint"]) == ("applied", "manual")
    assert doc["changes"] == [{"role": "decode", "from_replicas": 1, "to_replicas": 2}]
    assert h.reconciler.calls[-1][1] == {"prefill": 1, "decode": 2}
    code, out, _ = await run("scale", "deployment", "chat-pd", "--role", "decode", "--release")
    assert code == 0 and "manual: decode released (was pinned at 2)" in out
    code, out, _ = await run("scale", "deployment", "chat-pd", "--role", "decode",
                             "--replicas", "3", "--no-pin")  # fmt: skip
    assert code == 0 and "manual: decode 2 -> 3\n" in out
    code, out, _ = await run("scale", "deployment", "chat-pd", "--role", "decode", "--release")
    assert code == 0 and "manual: decode was not pinned" in out
    code, _, err = await run("scale", "deployment", "chat-pd", "--role", "decode",
                             "--replicas", "9")  # fmt: skip
    assert code == 1 and "FAILED_PRECONDITION" in err and "outside [1, 6]" in err
    code, _, err = await run("scale", "deployment", "chat-pd", "--role", "decode",
                             "--replicas", "-1")  # fmt: skip
    assert code == 1 and "--replicas must be >= 0" in err


async def test_without_postgres_rpcs_say_so() -> None:
    server = grpc.aio.server()
    add_to_server(AutoscalerServicer(None, lambda: 0), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = autoscaler_pb2_grpc.AutoscalerServiceStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.ListDeployments(autoscaler_pb2.ListDeploymentsRequest())
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "postgres_url" in (info.value.details() or "")
    finally:
        await server.stop(None)
