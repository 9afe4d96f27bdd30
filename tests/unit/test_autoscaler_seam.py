"""The seam's pure translations: spec role -> RoleTarget, spec + targets -> DeploymentTarget,
the planner's flat victims -> per role; and DriverReconciler's view of the reconciler."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import grpc
import pytest
from aiohttp import web

from services.autoscaler.drivers.dryrun import DryRunDriver
from services.autoscaler.drivers.sessions import HomeLoad, peers_of
from services.autoscaler.drivers.settings import DriverSettings
from services.autoscaler.reconciler import Reconciler
from services.autoscaler.seam import (
    ENGINE_COMMANDS,
    DriverReconciler,
    LoadPoller,
    SessionKVPoller,
    deployment_target,
    role_target,
    victims_by_role,
)
from services.common.planner.driver_base import (
    DriverError,
    InstanceState,
    InstanceStatus,
    Listener,
    Role,
    RoleTarget,
)
from services.common.planner.ports import InstanceView
from services.common.planner.spec import RoleSpec, load_spec_file
from tests.helpers.ports import free_port
from tests.helpers.waits import eventually

PD = Path(__file__).resolve().parents[2] / "deploy" / "examples" / "pd.yaml"


@pytest.mark.parametrize(
    ("role", "command"),
    [
        (RoleSpec(name="w", role="worker", engine="sim", args=("--profile", "test")), ()),
        (RoleSpec(name="p", role="prefill", engine="sglang"), ENGINE_COMMANDS["sglang"]),
        (RoleSpec(name="d", role="decode", engine="vllm"), ENGINE_COMMANDS["vllm"]),
        (
            RoleSpec(name="p", role="prefill", engine="sglang", template="my-sglang --port {port}"),
            ("my-sglang", "--port", "{port}"),
        ),
    ],
    ids=["sim-no-command", "sglang-default", "vllm-default", "template-is-the-command"],
)
def test_role_target(role: RoleSpec, command: tuple[str, ...]) -> None:
    t = role_target("chat", role, 3)
    assert (t.deployment, t.name, t.role, t.replicas) == ("chat", role.name, Role(role.role), 3)
    assert (t.engine_kind, t.command, t.args) == (role.engine, command, role.args)
    assert (t.restart, t.ports) == (role.restart_policy, role.ports)


def test_role_target_carries_restart_policy_and_ports() -> None:
    role = RoleSpec(name="w", role="worker", restart_policy="never", ports=(30001, 30002))
    t = role_target("stack", role, 1)
    assert (t.restart, t.ports) == ("never", (30001, 30002))


@pytest.mark.parametrize(
    ("skew_percent", "drain_s", "targets", "want_skew", "want"),
    [
        (0.0, 0.0, {"prefill": 4, "decode": 3}, 1.0, {"prefill": 4, "decode": 3}),
        (50.0, 12.5, {"prefill": 2}, 0.5, {"prefill": 2, "decode": 1}),
    ],
    ids=["uncoordinated-all-roles-driver-drain", "skew-fraction-spec-drain-missing-role"],
)
def test_deployment_target(
    skew_percent: float,
    drain_s: float,
    targets: dict[str, int],
    want_skew: float,
    want: dict[str, int],
) -> None:
    spec = load_spec_file(PD.read_text())
    coordination = {"max_skew_percent": skew_percent, "drain_timeout_s": drain_s}
    spec = spec.model_copy(
        update={"coordination": spec.coordination.model_copy(update=coordination)}
    )
    t = deployment_target(spec, targets, "planner: up")
    assert {r.name: r.replicas for r in t.roles} == want
    assert (t.max_skew, t.reason) == (want_skew, "planner: up")
    assert {r.drain_timeout_s for r in t.roles} == {drain_s}
    assert {r.drain_limit_s for r in t.roles} == {drain_s or None}
    assert t.role("prefill") is not None and t.role("prefill").dependencies == ()  # type: ignore[union-attr]


def test_victims_by_role_groups_and_drops_unknown() -> None:
    views = [
        InstanceView.of("p1", "chat", "prefill", "ready"),
        InstanceView.of("d1", "chat", "decode", "ready"),
        InstanceView.of("d2", "chat", "decode", "ready"),
    ]
    assert victims_by_role(["d2", "gone", "p1", "d1"], views) == {
        "decode": ["d2", "d1"],
        "prefill": ["p1"],
    }


class _Driver:
    """Instances appear READY at once; ``fail`` makes scale-out raise DriverError."""

    name = "fake"

    def __init__(self) -> None:
        self.fail = ""
        self.made: dict[str, InstanceStatus] = {}
        self._listener: Listener | None = None

    def set_listener(self, listener: Listener) -> None:
        self._listener = listener

    async def start(self) -> None:
        return None

    async def scale(self, role: RoleTarget, replicas: int, victims: Sequence[str] = ()) -> None:
        if self.fail:
            raise DriverError(self.fail)
        for v in victims:
            self.made.pop(v, None)
        mine = [i for i in self.made.values() if i.role_name == role.name]
        for k in range(len(mine), replicas):
            iid = f"{role.name}-{k}"
            self.made[iid] = InstanceStatus(
                iid, role.deployment, role.name, role.role, InstanceState.READY
            )

    def instances(self, deployment: str) -> Sequence[InstanceStatus]:
        return [i for i in self.made.values() if i.deployment == deployment]

    async def close(self) -> None:
        return None


async def test_driver_reconciler_drives_and_reports_progress() -> None:
    spec = load_spec_file(PD.read_text())
    driver = _Driver()
    settings = DriverSettings(resync_s=0.05, retry_base_s=0.05, retry_max_s=0.05)
    port = DriverReconciler(Reconciler(driver, settings))
    await port.start()
    try:
        assert port.progress("chat-pd") == ""
        await port.apply(spec, {"prefill": 2, "decode": 1}, ())
        await eventually(lambda: _is(port.progress("chat-pd"), "converged"))
        views = port.instances("chat-pd")
        assert sorted((v.role, v.state) for v in views) == [
            ("decode", "ready"),
            ("prefill", "ready"),
            ("prefill", "ready"),
        ]
        driver.fail = "cannot exec sglang"
        await port.apply(spec, {"decode": 2}, ())  # prefill keeps its 2
        await eventually(lambda: _is(port.progress("chat-pd")[:13], "half-applied:"))
        assert "cannot exec sglang" in port.progress("chat-pd")
        assert port.loop.status("chat-pd").roles[0].desired == 2  # type: ignore[union-attr]
    finally:
        await port.stop()


async def _is(got: str, want: str) -> bool:
    return got == want


async def test_dry_run_progress_says_nothing_changed() -> None:
    spec = load_spec_file(PD.read_text())
    port = DriverReconciler(Reconciler(DryRunDriver(), DriverSettings(resync_s=0.05)))
    await port.start()
    try:
        await port.apply(spec, {"prefill": 3}, ())
        assert port.progress("chat-pd") == (
            "dry-run: desired recorded (prefill 3, decode 1), nothing changed"
        )
        assert port.instances("chat-pd") == []
    finally:
        await port.stop()


async def test_instances_carry_the_engines_scraped_load() -> None:
    """A READY instance's ``/metrics`` (running, queued) becomes its view's in_flight and
    queued; an instance whose engine does not answer keeps 0."""
    app = web.Application()
    metrics = "sglang:num_running_reqs 3\nsglang:num_queue_reqs 2\nsglang:token_usage 0.5\n"

    async def serve_metrics(_request: web.Request) -> web.Response:
        return web.Response(text=metrics)

    app.router.add_get("/metrics", serve_metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    driver = _Driver()
    loop = Reconciler(driver, DriverSettings(resync_s=0.05))
    poller = LoadPoller(loop, interval_s=0.05, timeout_s=1.0)
    port_ = DriverReconciler(loop, poller)
    await port_.start()
    try:
        spec = load_spec_file(PD.read_text())
        await port_.apply(spec, {"prefill": 2, "decode": 0}, ())
        await eventually(lambda: _is(port_.progress("chat-pd"), "converged"))
        driver.made["prefill-0"] = replace(
            driver.made["prefill-0"], endpoint=f"http://127.0.0.1:{port}"
        )
        driver.made["prefill-1"] = replace(driver.made["prefill-1"], endpoint="http://127.0.0.1:1")

        async def loaded() -> bool:
            got = {v.instance_id: (v.in_flight, v.queued) for v in port_.instances("chat-pd")}
            return got == {"prefill-0": (3, 2), "prefill-1": (0, 0)}

        await eventually(loaded)
    finally:
        await port_.stop()
        await runner.cleanup()


class _Homes:
    """kvmeta's session blocks per instance; a deployment in ``down`` answers UNAVAILABLE."""

    def __init__(self) -> None:
        self.blocks: dict[str, dict[str, HomeLoad]] = {}
        self.down: set[str] = set()

    async def homes(self, deployment: str) -> dict[str, HomeLoad]:
        if deployment in self.down:
            raise grpc.aio.AioRpcError(
                grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), "down"
            )
        return dict(self.blocks.get(deployment, {}))


async def test_instances_carry_the_session_kv_kvmeta_reports() -> None:
    """kvmeta's session blocks and active sessions' tokens per instance become the views'
    session_blocks and active_session_tokens; an instance kvmeta does not list has 0; when
    kvmeta cannot answer the last answer is kept."""
    homes = _Homes()
    homes.blocks["chat-pd"] = {"prefill-0": HomeLoad(40, 2500), "elsewhere": HomeLoad(7, 9)}
    loop = Reconciler(_Driver(), DriverSettings(resync_s=0.05))
    port = DriverReconciler(loop, sessions=SessionKVPoller(loop, homes, interval_s=0.05))
    await port.start()
    try:
        spec = load_spec_file(PD.read_text())
        await port.apply(spec, {"prefill": 2, "decode": 0}, ())
        await eventually(lambda: _is(port.progress("chat-pd"), "converged"))

        async def weighed(want: dict[str, int]) -> bool:
            got = {v.instance_id: v.session_blocks for v in port.instances("chat-pd")}
            return got == want

        await eventually(lambda: weighed({"prefill-0": 40, "prefill-1": 0}))
        active = {v.instance_id: v.active_session_tokens for v in port.instances("chat-pd")}
        assert active == {"prefill-0": 2500, "prefill-1": 0}
        homes.down.add("chat-pd")
        homes.blocks["chat-pd"] = {}
        await port._sessions.poll_once()  # type: ignore[union-attr]
        assert await weighed({"prefill-0": 40, "prefill-1": 0})
    finally:
        await port.stop()


@pytest.mark.parametrize(
    ("victim", "want"),
    [
        ("p-0", ["p-1"]),  # same deployment and role, READY, not the victim
        ("d-0", []),  # the only decode instance: nowhere to go
    ],
    ids=["peers-of-its-role", "no-peer"],
)
def test_peers_of(victim: str, want: list[str]) -> None:
    def st(iid: str, role: str, state: InstanceState = InstanceState.READY, dep: str = "chat"
           ) -> InstanceStatus:  # fmt: skip
        return InstanceStatus(iid, dep, role, Role.WORKER, state)

    fleet = [st("p-0", "prefill"), st("p-1", "prefill"), st("p-2", "prefill", InstanceState.DRAINING),
             st("p-3", "prefill", InstanceState.STARTING), st("p-9", "prefill", dep="other"),
             st("d-0", "decode")]  # fmt: skip
    me = next(s for s in fleet if s.instance_id == victim)
    assert [s.instance_id for s in peers_of(me, fleet)] == want
