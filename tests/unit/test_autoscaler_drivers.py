"""Driver pieces that are pure: victim choice, back-off, the local driver's command lines,
the drain rule, membership events, and the dry-run driver's records."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import ValidationError
from redis.exceptions import ConnectionError as RedisConnectionError
from tideserve.v1 import common_pb2, events_pb2

from services.autoscaler.drivers.argv import render_argv, render_sidecars
from services.autoscaler.drivers.build import build_driver, build_reconciler
from services.autoscaler.drivers.drain import is_drained
from services.autoscaler.drivers.dryrun import DryRunAction, DryRunDriver
from services.autoscaler.drivers.kubernetes import KubernetesDriver
from services.autoscaler.drivers.local import LocalDriver
from services.autoscaler.drivers.settings import DriverSettings, LocalSettings
from services.autoscaler.membership import MembershipPublisher, to_event
from services.common.planner.driver_base import (
    Driver,
    DriverError,
    InstanceState,
    InstanceStatus,
    Role,
    RoleTarget,
    backoff_s,
    choose_victims,
)

ME = events_pb2.MembershipEvent
S, R, F = InstanceState.STARTING, InstanceState.READY, InstanceState.FAILED


def _i(iid: str, state: InstanceState, started_ms: int = 0) -> InstanceStatus:
    return InstanceStatus(iid, "d", "w", Role.WORKER, state, started_ms=started_ms)


CANDIDATES = [_i("old", R, 1), _i("new", R, 5), _i("boot", S, 9), _i("dead", F, 2)]


@pytest.mark.parametrize(
    ("n", "preferred", "victims"),
    [
        (0, (), []),
        (1, (), ["dead"]),
        (2, (), ["dead", "boot"]),
        (3, (), ["dead", "boot", "new"]),
        (4, (), ["dead", "boot", "new", "old"]),
        (2, ("old",), ["old", "dead"]),
        (1, ("gone", "new"), ["new"]),
        (2, ("new", "new"), ["new", "dead"]),
    ],
    ids=[
        "none",
        "failed-first",
        "then-starting",
        "then-newest-ready",
        "all",
        "preferred-first",
        "unknown-preferred-skipped",
        "duplicates-once",
    ],
)
def test_choose_victims(n: int, preferred: tuple[str, ...], victims: list[str]) -> None:
    assert choose_victims(CANDIDATES, n, preferred) == victims


@pytest.mark.parametrize(
    ("failures", "delay"),
    [(0, 0.0), (1, 1.0), (2, 2.0), (3, 4.0), (6, 30.0), (1000, 30.0)],
    ids=["none", "first", "doubles", "again", "capped", "huge-capped"],
)
def test_backoff(failures: int, delay: float) -> None:
    assert backoff_s(failures, 1.0, 30.0) == delay


def _target(**kw: object) -> RoleTarget:
    return RoleTarget("dep", "prefill", Role.PREFILL, 1, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("target", "argv"),
    [
        (
            _target(args=("--speedup", "4")),
            ["py", "-m", "services.cli", "engine", "--host", "h", "--port", "31000",
             "--instance-id", "i1", "--role", "prefill", "--deployment", "dep",
             "--state-dir", "/s/i1", "--log-level", "WARNING", "--speedup", "4"],
        ),
        (
            _target(
                command=("python", "-m", "sglang.launch_server", "--port", "{port}"),
                args=("--host", "{host}", "--disaggregation-mode", "{role}"),
            ),
            ["python", "-m", "sglang.launch_server", "--port", "31000", "--host", "h",
             "--disaggregation-mode", "prefill"],
        ),
        (
            _target(command=("vllm", "serve", "m", "--port={port}", "--served-model-name={deployment}")),
            ["vllm", "serve", "m", "--port=31000", "--served-model-name=dep"],
        ),
        (
            RoleTarget("dep", "kv", Role.KVCACHE, 1, args=("--kvcache-mib", "64")),
            ["py", "-m", "services.cli", "engine", "--host", "h", "--port", "31000",
             "--instance-id", "i1", "--role", "kvcache", "--deployment", "dep",
             "--state-dir", "/s/i1", "--log-level", "WARNING", "--kvcache-mib", "64"],
        ),
    ],
    ids=["simulator", "sglang", "vllm", "simulator-kvcache"],
)  # fmt: skip
def test_render_argv(target: RoleTarget, argv: list[str]) -> None:
    got = render_argv(
        target, host="h", port=31000, instance_id="i1", state_dir=Path("/s"), python="py"
    )
    assert list(got) == argv


@pytest.mark.parametrize(
    "target",
    [_target(command=("x", "--port", "{prot}"))],
    ids=["unknown-placeholder"],
)
def test_render_argv_refuses(target: RoleTarget) -> None:
    with pytest.raises(DriverError):
        render_argv(target, host="h", port=1, instance_id="i", state_dir=Path("/s"))


@pytest.mark.parametrize(
    ("sidecars", "argvs"),
    [
        ((), []),
        (
            (("tideserve", "kv-bridge", "--endpoint", "ipc://{state_dir}/kv",
              "--instance-id", "{instance_id}", "--deployment", "{deployment}"),),
            [("tideserve", "kv-bridge", "--endpoint", "ipc:///s/i1/kv",
              "--instance-id", "i1", "--deployment", "dep")],
        ),
        (
            (("a", "{port}"), ("b", "{host}", "{{literal}}")),
            [("a", "31000"), ("b", "h", "{literal}")],
        ),
    ],
    ids=["none", "kv-bridge", "two-and-literal-braces"],
)  # fmt: skip
def test_render_sidecars(
    sidecars: tuple[tuple[str, ...], ...], argvs: list[tuple[str, ...]]
) -> None:
    target = _target(command=("vllm", "serve"), sidecars=sidecars)
    got = render_sidecars(target, host="h", port=31000, instance_id="i1", state_dir=Path("/s"))
    assert got == argvs


def test_render_sidecars_refuses_an_unknown_placeholder() -> None:
    target = _target(command=("vllm",), sidecars=(("x", "{nope}"),))
    with pytest.raises(DriverError, match="nope"):
        render_sidecars(target, host="h", port=1, instance_id="i", state_dir=Path("/s"))


def test_state_dir_placeholder_is_the_instances_own() -> None:
    target = _target(command=("vllm", "--x", "ipc://{state_dir}/kv"))
    got = render_argv(target, host="h", port=1, instance_id="i9", state_dir=Path("/s"))
    assert got == ("vllm", "--x", "ipc:///s/i9/kv")


@pytest.mark.parametrize(
    ("schedulers", "engine", "drained"),
    [
        ([], None, True),
        ([0, 0], 0, True),
        ([0, 0], None, True),
        ([0, 1], 0, False),
        ([0, None], 0, False),
        ([0], 2, False),
        ([], 1, False),
    ],
    ids=[
        "no-signal-at-all",
        "all-zero",
        "engine-without-metrics",
        "a-gateway-still-streams",
        "a-gateway-unreachable",
        "engine-still-running",
        "engine-only",
    ],
)
def test_is_drained(schedulers: list[int | None], engine: int | None, drained: bool) -> None:
    assert is_drained(schedulers, engine) is drained


@pytest.mark.parametrize(
    ("state", "kind", "pb_state"),
    [
        (InstanceState.STARTING, None, None),
        (InstanceState.READY, ME.KIND_ADDED, common_pb2.INSTANCE_STATE_READY),
        (InstanceState.DRAINING, ME.KIND_STATE_CHANGED, common_pb2.INSTANCE_STATE_DRAINING),
        (InstanceState.FAILED, ME.KIND_STATE_CHANGED, common_pb2.INSTANCE_STATE_FAILED),
        (InstanceState.STOPPED, ME.KIND_REMOVED, common_pb2.INSTANCE_STATE_STOPPED),
    ],
    ids=["starting-silent", "ready-added", "draining", "failed", "stopped-removed"],
)
def test_to_event(state: InstanceState, kind: int | None, pb_state: int | None) -> None:
    status = InstanceStatus(
        "i1", "dep", "prefill", Role.PREFILL, state, "http://h:1",
        started_ms=1000, ready_ms=3500, restarts=2,
    )  # fmt: skip
    ev = to_event(status, "why", 9000)
    if kind is None:
        assert ev is None
        return
    assert ev is not None
    assert (ev.kind, ev.instance.state, ev.reason, ev.ts_ms) == (kind, pb_state, "why", 9000)
    assert ev.instance.role == common_pb2.ROLE_PREFILL
    assert ev.instance.endpoint.url == "http://h:1"
    assert dict(ev.instance.labels) == {
        "role_name": "prefill",
        "startup_ms": "2500",
        "restarts": "2",
    }
    assert ev.instance.epoch == 2


async def test_dry_run_records_changes_once_and_changes_nothing() -> None:
    seen = [_i("a", R, 1), _i("b", R, 2)]
    driver = DryRunDriver(lambda _d: seen, wall=lambda: 7.0)
    role = RoleTarget("d", "w", Role.WORKER, 1)
    await driver.scale(role, 1)
    await driver.scale(role, 1)  # same request: not recorded twice
    await driver.scale(role, 3)
    assert driver.actions == [
        DryRunAction("d", "w", 2, 1, ("b",), 7000),
        DryRunAction("d", "w", 2, 3, (), 7000),
    ]
    assert driver.instances("d") == ()
    with pytest.raises(DriverError):
        await driver.scale(role, -1)


class FlakyProducer:
    """A StreamProducer stand-in: fails while ``down``, else records (stream, event)."""

    def __init__(self) -> None:
        self.down = False
        self.sent: list[tuple[str, str]] = []

    async def publish(self, stream: str, msg: events_pb2.MembershipEvent) -> str:
        if self.down:
            raise RedisConnectionError("connection refused")
        self.sent.append((stream, msg.instance.instance_id))
        return "1-0"


async def test_membership_outbox_keeps_order_through_an_outage() -> None:
    producer = FlakyProducer()
    pub = MembershipPublisher(producer, "pfx", outbox=2)  # type: ignore[arg-type]

    def ev(iid: str) -> events_pb2.MembershipEvent:
        return ME(kind=ME.KIND_ADDED, instance=common_pb2.Instance(instance_id=iid))

    assert await pub.publish(ev("a"))
    producer.down = True
    assert not await pub.publish(ev("b"))
    assert not await pub.publish(ev("c"))
    assert not await pub.publish(ev("d"))  # outbox of 2: "b" dropped, counted
    assert (pub.pending, pub.dropped) == (2, 1)
    producer.down = False
    assert await pub.flush()
    assert producer.sent == [("pfx:membership", i) for i in ("a", "c", "d")]
    assert (pub.pending, pub.published) == (0, 3)


@pytest.mark.parametrize(
    ("kind", "cls"),
    [("dry-run", DryRunDriver), ("local", LocalDriver), ("kubernetes", KubernetesDriver)],
    ids=["dry-run", "local", "kubernetes"],
)
async def test_build_reconciler_picks_the_driver(kind: str, cls: type, tmp_path: Path) -> None:
    settings = DriverSettings(kind=kind, local=LocalSettings(state_dir=str(tmp_path)))  # type: ignore[arg-type]
    rec = build_reconciler(settings, None)
    assert isinstance(rec.driver, cls)
    assert rec.driver.name == kind
    assert rec.publisher is None
    assert isinstance(build_driver(settings), Driver)


@pytest.mark.parametrize(
    ("fmt", "needle"),
    [("{role}", "must contain {n}"), ("{role}-{x}", "only {deployment}, {role}, {n}")],
    ids=["no-number", "unknown-placeholder"],
)
def test_local_instance_id_format_is_checked(fmt: str, needle: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(needle)):
        LocalSettings(instance_id_format=fmt)
