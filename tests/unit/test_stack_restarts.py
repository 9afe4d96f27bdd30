"""The stack's service restart rule (services/stack/restarts.py)."""

from __future__ import annotations

import pytest

from services.stack.restarts import RestartPolicy, plan_restart

POLICY = RestartPolicy(max_restarts=3, window_s=60.0, base_delay_s=0.5, max_delay_s=1.0)


@pytest.mark.parametrize(
    ("history", "now", "restart", "delay"),
    [
        ((), 100.0, True, 0.0),
        ((90.0,), 100.0, True, 0.5),
        ((80.0, 90.0), 100.0, True, 1.0),
        ((70.0, 80.0, 90.0), 100.0, False, 0.0),
        ((10.0, 20.0, 90.0), 100.0, True, 0.5),
        ((10.0, 20.0, 30.0), 100.0, True, 0.0),
    ],
    ids=[
        "first-at-once",
        "second-backs-off",
        "capped",
        "crash-loop",
        "old-ones-forgotten",
        "all-old",
    ],
)
def test_plan_restart(history: tuple[float, ...], now: float, restart: bool, delay: float) -> None:
    plan = plan_restart(history, now, POLICY)
    assert (plan.restart, plan.delay_s) == (restart, delay)
    if restart:
        assert plan.history[-1] == now + delay
        assert all(now - t < POLICY.window_s for t in plan.history[:-1])


def test_zero_restarts_never_restarts() -> None:
    assert not plan_restart((), 0.0, RestartPolicy(max_restarts=0)).restart


@pytest.mark.parametrize(
    "kw",
    [{"max_restarts": -1}, {"window_s": 0}, {"base_delay_s": 2.0, "max_delay_s": 1.0}],
    ids=["negative", "no-window", "delays-inverted"],
)
def test_bad_policy_is_rejected(kw: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        RestartPolicy(**kw)  # type: ignore[arg-type]
