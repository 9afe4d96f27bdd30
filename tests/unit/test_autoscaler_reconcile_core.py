"""The reconciler's pure rules: which steps a deployment takes next (dependencies, maxSkew,
scale-in order, victims), and how a DeploymentStatus summarises desired vs actual."""

from __future__ import annotations

import pytest

from services.autoscaler.reconcile_core import RoleCount, Step, plan_steps
from services.autoscaler.reconciler import DeploymentStatus, RoleStatus
from services.common.planner.driver_base import (
    DeploymentTarget,
    InstanceState,
    InstanceStatus,
    Role,
    RoleTarget,
)

S, R, D, F = (
    InstanceState.STARTING,
    InstanceState.READY,
    InstanceState.DRAINING,
    InstanceState.FAILED,
)


def _role(name: str, n: int, deps: tuple[str, ...] = ()) -> RoleTarget:
    role = {"prefill": Role.PREFILL, "decode": Role.DECODE}.get(name, Role.WORKER)
    return RoleTarget("d", name, role, n, dependencies=deps)


def _insts(role: str, *states: InstanceState) -> list[InstanceStatus]:
    return [
        InstanceStatus(f"{role}-{k}", "d", role, Role.WORKER, st, started_ms=k)
        for k, st in enumerate(states)
    ]


@pytest.mark.parametrize(
    ("roles", "skew", "instances", "steps", "waiting"),
    [
        ([_role("w", 2)], 1.0, _insts("w", R, R), [], {}),
        ([_role("w", 3)], 1.0, _insts("w", R), [Step("w", 3)], {}),
        ([_role("w", 3)], 1.0, _insts("w", R, S, F), [], {}),
        ([_role("w", 1)], 1.0, _insts("w", R, R, D), [Step("w", 1)], {}),
        ([_role("w", 2)], 1.0, _insts("w", R, D, D), [Step("w", 2)], {}),
        (
            [_role("decode", 2), _role("prefill", 2, ("decode",))],
            1.0,
            [],
            [Step("decode", 2)],
            {"prefill": "waits for decode to serve"},
        ),
        (
            [_role("decode", 2), _role("prefill", 2, ("decode",))],
            1.0,
            _insts("decode", R, S),
            [Step("prefill", 2)],
            {},
        ),
        (
            [_role("decode", 1), _role("prefill", 1, ("decode",))],
            1.0,
            _insts("decode", R, R) + _insts("prefill", R, R),
            [Step("prefill", 1)],
            {"decode": "scales in after prefill"},
        ),
        (
            [_role("decode", 4), _role("prefill", 4)],
            0.25,
            [],
            [Step("decode", 1), Step("prefill", 1)],
            {},
        ),
        (
            [_role("decode", 4), _role("prefill", 4)],
            0.25,
            _insts("decode", R) + _insts("prefill", S),
            [],
            {"decode": "held by maxSkew 0.25 (slowest role at 0%)"},
        ),
        (
            [_role("decode", 4), _role("prefill", 4)],
            0.25,
            _insts("decode", R, R) + _insts("prefill", R, R),
            [Step("decode", 3), Step("prefill", 3)],
            {},
        ),
        ([_role("w", 0)], 1.0, _insts("w", R, S), [Step("w", 0)], {}),
    ],
    ids=[
        "at-target",
        "scale-out-to-target",
        "pending-and-failed-count-no-cascade",
        "scale-in-draining-not-counted",
        "draining-does-not-count-so-replace",
        "dependent-waits-for-dependency",
        "dependent-goes-once-dependency-serves",
        "dependency-scales-in-after-dependent",
        "max-skew-first-batch",
        "max-skew-holds-the-faster-role",
        "max-skew-next-batch-when-both-ready",
        "scale-to-zero",
    ],
)
def test_plan_steps(
    roles: list[RoleTarget],
    skew: float,
    instances: list[InstanceStatus],
    steps: list[Step],
    waiting: dict[str, str],
) -> None:
    plan = plan_steps(DeploymentTarget("d", tuple(roles), max_skew=skew), instances)
    assert list(plan.steps) == steps
    assert dict(plan.waiting) == waiting


def test_scale_in_step_carries_the_callers_victims() -> None:
    target = DeploymentTarget("d", (_role("w", 1),))
    plan = plan_steps(target, _insts("w", R, R, R), {"w": ["w-0"]})
    assert plan.steps == (Step("w", 1, ("w-0",)),)


@pytest.mark.parametrize(
    ("roles", "summary"),
    [
        ((RoleStatus("w", 2, RoleCount(ready=2)),), "converged"),
        (
            (RoleStatus("w", 3, RoleCount(ready=2, starting=1)),),
            "applying: w 2/3 ready (1 starting)",
        ),
        (
            (RoleStatus("w", 3, RoleCount(ready=2, failed=1)),),
            "half-applied: w 2/3 ready (1 failed)",
        ),
        (
            (
                RoleStatus("decode", 2, RoleCount(ready=2)),
                RoleStatus("prefill", 2, RoleCount(), "", "cannot start 'x': No such file", 3),
            ),
            "half-applied: prefill 0/2 ready; error x3: cannot start 'x': No such file",
        ),
        (
            (RoleStatus("prefill", 2, RoleCount(), "waits for decode to serve"),),
            "applying: prefill 0/2 ready; waits for decode to serve",
        ),
        (
            (
                RoleStatus(
                    "decode",
                    2,
                    RoleCount(ready=1, starting=1),
                    "",
                    "",
                    0,
                    0.0,
                    ("p-3: stuck Pending 130s: Unschedulable: no gpu",),
                ),
            ),
            "half-applied: decode 1/2 ready (1 starting); p-3: stuck Pending 130s: "
            "Unschedulable: no gpu",
        ),
        (
            (RoleStatus("w", 1, RoleCount(ready=1, draining=1)),),
            "applying: w 1/1 ready (1 draining)",
        ),
    ],
    ids=[
        "converged",
        "starting",
        "failed-instance",
        "driver-error",
        "waiting",
        "stuck-pending",
        "draining",
    ],
)
def test_status_summary(roles: tuple[RoleStatus, ...], summary: str) -> None:
    status = DeploymentStatus("d", roles)
    assert status.summary == summary
    assert status.converged == (summary == "converged")
