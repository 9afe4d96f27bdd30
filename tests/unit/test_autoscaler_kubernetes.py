"""The kubernetes driver against a fake API server.

No Kubernetes API server runs here: tests/helpers/fake_kube.py is a small in-process aiohttp
server implementing exactly the endpoints the driver uses (scale subresources of a
RoleBasedGroupScalingAdapter, a Deployment and a StatefulSet; pod list, watch and patch),
playing the controller's part, and recording every call. The checks are on the call
sequence: scale-out patches replicas up; scale-in drains each victim (DRAINING announced),
annotates it with a low pod-deletion-cost, and only then lowers replicas, so exactly the
victims go. Also: pod states from pod JSON, API errors and stuck Pending pods surfaced."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp.test_utils import TestServer
from kubernetes.aio import client as kclient

from services.autoscaler.drivers.drain import Drainer
from services.autoscaler.drivers.kubernetes import KubernetesDriver, pod_status
from services.autoscaler.drivers.settings import KubernetesSettings
from services.common.planner.driver_base import (
    DriverError,
    InstanceState,
    InstanceStatus,
    Role,
    RoleTarget,
)
from tests.helpers.autoscale import RecordingDrainer
from tests.helpers.fake_kube import Call, FakeKube
from tests.helpers.waits import eventually

ROLE = RoleTarget("llm", "decode", Role.DECODE, 2)
ADAPTER = "/apis/workloads.x-k8s.io/v1alpha2/namespaces/default/rolebasedgroupscalingadapters"
APPS = "/apis/apps/v1/namespaces/default"
PODS = "/api/v1/namespaces/default/pods"


class Rig:
    def __init__(self, fake: FakeKube, driver: KubernetesDriver) -> None:
        self.fake, self.driver = fake, driver


@contextlib.asynccontextmanager
async def _rig(
    target: str, kind: str, name: str, replicas: int, drainer: Drainer | None = None
) -> AsyncIterator[Rig]:
    fake = FakeKube()
    server = TestServer(fake.app(), host="127.0.0.1")
    await server.start_server()
    fake.port = server.port or 0
    fake.add_scaled(kind, name, replicas)
    for pod in fake.names(kind, name):
        fake.make_ready(pod)
    settings = KubernetesSettings(target=target, engine_port=fake.port,  # type: ignore[arg-type]
                                  pending_timeout_s=60, watch_timeout_s=5)  # fmt: skip
    api = kclient.ApiClient(kclient.Configuration(host=str(server.make_url("")).rstrip("/")))
    driver = KubernetesDriver(settings, drainer or Drainer([], timeout_s=5, poll_s=0.05), api=api)

    async def listen(status: InstanceStatus, _reason: str) -> None:
        fake.calls.append(Call("EVENT", f"{status.instance_id} {status.state.value}"))

    driver.set_listener(listen)
    await driver.start()
    try:
        yield Rig(fake, driver)
    finally:
        await driver.close()
        await server.close()


@pytest.fixture
async def adapter() -> AsyncIterator[Rig]:
    async with _rig("adapter", "adapter", "llm-decode", 3) as rig:
        yield rig


def _mutations(calls: list[Call]) -> list[tuple[str, str, Any]]:
    """PATCH calls and listener events, in order (reads left out, and the "stopped" events
    the watch delivers whenever it gets to them after the replicas went down)."""
    return [
        (c.method, c.path, c.body)
        for c in calls
        if c.method == "PATCH" or (c.method == "EVENT" and not c.path.endswith(" stopped"))
    ]


def _scale_patch(path: str, n: int) -> tuple[str, str, Any]:
    return ("PATCH", path, {"spec": {"replicas": n}})


def _cost(pod: str) -> tuple[str, str, Any]:
    body = {"metadata": {"annotations": {"controller.kubernetes.io/pod-deletion-cost": "-1000"}}}
    return ("PATCH", f"{PODS}/{pod}", body)


@pytest.mark.parametrize(
    ("target", "kind", "scale_path", "victims", "expect_gone"),
    [
        ("adapter", "adapter", f"{ADAPTER}/llm-decode/scale", ["llm-decode-2"],
         ["llm-decode-2", "llm-decode-0"]),
        ("deployment", "deployments", f"{APPS}/deployments/llm-decode/scale", ["llm-decode-1"],
         ["llm-decode-1", "llm-decode-0"]),
        ("statefulset", "statefulsets", f"{APPS}/statefulsets/llm-decode/scale",
         ["llm-decode-0"], ["llm-decode-2", "llm-decode-1"]),
    ],
    ids=["adapter", "deployment", "statefulset-highest-ordinals"],
)  # fmt: skip
async def test_scale_in_drains_annotates_then_scales(
    target: str, kind: str, scale_path: str, victims: list[str], expect_gone: list[str]
) -> None:
    async with _rig(target, kind, "llm-decode", 3) as rig:
        await rig.driver.scale(ROLE, 3)  # already there: reads only
        assert _mutations(rig.fake.calls)[-1:] != [_scale_patch(scale_path, 3)]
        assert [i.state for i in rig.driver.instances("llm")] == [InstanceState.READY] * 3
        start = len(rig.fake.calls)
        await rig.driver.scale(ROLE, 1, victims)
        first, second = expect_gone
        assert _mutations(rig.fake.calls[start:]) == [
            ("EVENT", f"{first} draining", None),
            ("EVENT", f"{second} draining", None),
            _cost(first),
            _cost(second),
            _scale_patch(scale_path, 1),
        ]
        assert set(rig.fake.names(kind, "llm-decode")) == {"llm-decode-0", "llm-decode-1",
                                                              "llm-decode-2"} - set(expect_gone)  # fmt: skip

        async def gone() -> bool:
            return {i.instance_id for i in rig.driver.instances("llm")} == set(
                rig.fake.names(kind, "llm-decode")
            )

        await eventually(gone)


@pytest.mark.parametrize(
    ("spec_timeout_s", "limit"),
    [(0.0, None), (7.5, 7.5)],
    ids=["spec-0-driver-default", "spec-timeout-bounds-the-drain"],
)
async def test_scale_in_drains_within_the_specs_drain_timeout(
    spec_timeout_s: float, limit: float | None
) -> None:
    drainer = RecordingDrainer([], timeout_s=5, poll_s=0.05)
    async with _rig("adapter", "adapter", "llm-decode", 3, drainer) as rig:
        role = replace(ROLE, drain_timeout_s=spec_timeout_s)
        await rig.driver.scale(role, 1)
    assert drainer.limits == [limit, limit]
    assert all(res.drained for _, res in drainer.results)
    # drain and migrate: each drained victim's sessions go to the one pod that stays
    (stays,) = {tuple(peers) for _, peers in drainer.migrations}
    assert len(stays) == 1 and len(drainer.migrations) == 2
    assert stays[0] not in {v for v, _ in drainer.migrations}


async def test_scale_out_patches_up_and_watches_readiness(adapter: Rig) -> None:
    start = len(adapter.fake.calls)
    await adapter.driver.scale(ROLE, 5)
    patches = [m for m in _mutations(adapter.fake.calls[start:]) if m[0] == "PATCH"]
    assert patches == [_scale_patch(f"{ADAPTER}/llm-decode/scale", 5)]

    async def five() -> bool:
        return len(adapter.driver.instances("llm")) == 5

    await eventually(five)
    states = {i.instance_id: i.state for i in adapter.driver.instances("llm")}
    assert states["llm-decode-3"] == InstanceState.STARTING
    adapter.fake.make_ready("llm-decode-3")

    async def ready() -> bool:
        st = {i.instance_id: i for i in adapter.driver.instances("llm")}["llm-decode-3"]
        return st.state == InstanceState.READY and st.endpoint.startswith("http://127.0.0.1:")

    await eventually(ready)
    # a scale-out that the caller repeats is not patched twice
    start = len(adapter.fake.calls)
    await adapter.driver.scale(ROLE, 5)
    assert [c for c in adapter.fake.calls[start:] if c.method == "PATCH"] == []


async def test_stuck_pending_is_surfaced(adapter: Rig) -> None:
    await adapter.driver.scale(ROLE, 4)
    await eventually(lambda: _has(adapter, "llm-decode-3"))
    adapter.fake.make_unschedulable("llm-decode-3", "2020-01-01T00:00:00Z")

    async def stuck() -> bool:
        st = {i.instance_id: i for i in adapter.driver.instances("llm")}["llm-decode-3"]
        return st.last_error.startswith("stuck Pending")

    await eventually(stuck)
    st = {i.instance_id: i for i in adapter.driver.instances("llm")}["llm-decode-3"]
    assert st.state == InstanceState.STARTING  # still capacity on the way: no cascade
    assert "Unschedulable: 0/3 nodes are available" in st.last_error


async def _has(rig: Rig, name: str) -> bool:
    return any(i.instance_id == name for i in rig.driver.instances("llm"))


@pytest.mark.parametrize(
    ("fail", "replicas", "message"),
    [
        (("PATCH", f"{ADAPTER}/llm-decode/scale"), 5,
         "kubernetes patch adapter default/llm-decode scale to 5: 403 Forbidden: "
         "no patch for you"),
        (("GET", f"{ADAPTER}/llm-decode/scale"), 5,
         "kubernetes get adapter default/llm-decode scale: 403 Forbidden: no patch for you"),
        (("PATCH", f"{PODS}/llm-decode-0"), 2,
         "kubernetes annotate pod default/llm-decode-0: 403 Forbidden: no patch for you"),
    ],
    ids=["patch-scale", "get-scale", "annotate"],
)  # fmt: skip
async def test_api_errors_are_driver_errors(
    adapter: Rig, fail: tuple[str, str], replicas: int, message: str
) -> None:
    adapter.fake.fail[fail] = (403, "no patch for you")
    with pytest.raises(DriverError) as err:
        await adapter.driver.scale(ROLE, replicas)
    assert str(err.value) == message


async def test_failed_scale_in_is_retried_on_the_same_victim_or_undone(adapter: Rig) -> None:
    adapter.fake.fail[("PATCH", f"{PODS}/llm-decode-0")] = (500, "etcd timeout")
    with pytest.raises(DriverError, match="500"):
        await adapter.driver.scale(ROLE, 2)
    states = {i.instance_id: i.state for i in adapter.driver.instances("llm")}
    assert states["llm-decode-0"] == InstanceState.DRAINING  # drained, not yet removed
    start = len(adapter.fake.calls)
    await adapter.driver.scale(ROLE, 2)  # the retry removes the same pod, not another one
    assert _mutations(adapter.fake.calls[start:]) == [
        _cost("llm-decode-0"),
        _scale_patch(f"{ADAPTER}/llm-decode/scale", 2),
    ]
    # a scale-in that failed, then a scale-out: the drained pod serves again
    adapter.fake.fail[("PATCH", f"{PODS}/llm-decode-1")] = (500, "etcd timeout")
    with pytest.raises(DriverError):
        await adapter.driver.scale(ROLE, 1)
    start = len(adapter.fake.calls)
    await adapter.driver.scale(ROLE, 2)
    assert _mutations(adapter.fake.calls[start:]) == [("EVENT", "llm-decode-1 ready", None)]


async def test_unknown_scale_target_is_a_driver_error(adapter: Rig) -> None:
    other = RoleTarget("llm", "prefill", Role.PREFILL, 1)
    with pytest.raises(DriverError, match="404 Not Found: adapter llm-prefill not found"):
        await adapter.driver.scale(other, 1)


NOW = "2026-01-01T00:10:00Z"
NOW_MS = 1767226200000


def _pod(phase: str, **status: Any) -> dict[str, Any]:
    meta = {"name": "p-0", "creationTimestamp": "2026-01-01T00:00:00Z"}
    meta.update(status.pop("meta", {}))
    return {"metadata": meta, "status": {"phase": phase, "podIP": "10.0.0.7", **status}}


READY = [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T00:00:42Z"}]
CRASH = [{"name": "e", "restartCount": 4,
          "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s"}}}]  # fmt: skip
UNSCHED = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
            "message": "no gpu"}]  # fmt: skip


@pytest.mark.parametrize(
    ("pod", "timeout_s", "state", "error", "startup_ms", "restarts"),
    [
        (_pod("Pending"), 3600, InstanceState.STARTING, "", 0, 0),
        (_pod("Pending", conditions=UNSCHED), 60, InstanceState.STARTING,
         "stuck Pending 600s: Unschedulable: no gpu", 0, 0),
        (_pod("Running"), 60, InstanceState.STARTING, "", 0, 0),
        (_pod("Running", conditions=READY), 60, InstanceState.READY, "", 42_000, 0),
        (_pod("Running", containerStatuses=CRASH), 60, InstanceState.FAILED,
         "CrashLoopBackOff: back-off 40s", 0, 4),
        (_pod("Failed", reason="Evicted"), 60, InstanceState.FAILED, "pod failed: Evicted", 0, 0),
        (_pod("Running", conditions=READY, meta={"deletionTimestamp": NOW}), 60,
         InstanceState.DRAINING, "", 0, 0),
        (_pod("Succeeded"), 60, InstanceState.STOPPED, "", 0, 0),
    ],
    ids=["pending", "stuck-pending", "running-not-ready", "ready", "crashloop", "failed",
         "terminating", "succeeded"],
)  # fmt: skip
def test_pod_status(
    pod: dict[str, Any],
    timeout_s: float,
    state: InstanceState,
    error: str,
    startup_ms: int,
    restarts: int,
) -> None:
    st = pod_status(pod, ROLE, port=8000, now_ms=NOW_MS, pending_timeout_s=timeout_s)
    assert (st.state, st.last_error, st.startup_ms, st.restarts) == (
        state, error, startup_ms, restarts,
    )  # fmt: skip
    assert st.endpoint == "http://10.0.0.7:8000"
    assert (st.instance_id, st.role_name, st.role) == ("p-0", "decode", Role.DECODE)


RBAC = Path(__file__).resolve().parents[2] / "deploy" / "k8s" / "rbac" / "autoscaler.yaml"


def _permission(call: Call) -> tuple[str, str, str]:
    """(apiGroup, resource, verb) a recorded call needs."""
    path = call.path.split("?", 1)[0]
    if path.startswith("/api/v1/namespaces/default/pods"):
        if call.method == "PATCH":
            return ("", "pods", "patch")
        return ("", "pods", "watch" if "watch=true" in call.path else "list")
    parts = path.split("/")  # /apis/<group>/<version>/namespaces/<ns>/<plural>/<name>/scale
    return (parts[2], f"{parts[6]}/scale", "get" if call.method == "GET" else "patch")


async def test_rbac_grants_exactly_what_the_driver_uses() -> None:
    used: set[tuple[str, str, str]] = set()
    for target, kind in (("adapter", "adapter"), ("deployment", "deployments"),
                         ("statefulset", "statefulsets")):  # fmt: skip
        async with _rig(target, kind, "llm-decode", 2) as rig:
            await rig.driver.scale(ROLE, 3)
            await rig.driver.scale(ROLE, 1)
            await eventually(lambda r=rig: _watched(r))  # type: ignore[misc]
            used |= {_permission(c) for c in rig.fake.calls if c.method != "EVENT"}
    role = next(d for d in yaml.safe_load_all(RBAC.read_text()) if d["kind"] == "Role")
    granted = {
        (group, res, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for res in rule["resources"]
        for verb in rule["verbs"]
    }
    adapter = ("workloads.x-k8s.io", "rolebasedgroupscalingadapters/scale")
    assert {(g, r) for g, r, _ in used} >= {adapter, ("apps", "deployments/scale")}
    assert used == granted


async def _watched(rig: Rig) -> bool:
    return any("watch=true" in c.path for c in rig.fake.calls)
