"""Pre-emption planning: only before the first byte, only for strictly lower classes, one
victim per waiting higher-class request, nothing when a freed slot would not help."""

from __future__ import annotations

import pytest

from services.common.admission import (
    AdmissionQueue,
    InFlight,
    QueuedRequest,
    plan_preemptions,
)

PRIO = {"interactive": 30, "agent": 20, "batch": 10}


def queue(*waiting: str) -> AdmissionQueue:
    q = AdmissionQueue()
    for i, cls in enumerate(waiting):
        q.offer(QueuedRequest(f"w{i}", slo_class=cls), 0.0)
    return q


def fl(rid: str, cls: str, started: bool = False, at: float = 0.0) -> InFlight:
    return InFlight(rid, PRIO[cls], started, at)


@pytest.mark.parametrize(
    ("waiting", "in_flight", "kw", "expected"),
    [
        (("interactive",), [fl("b", "batch")], {}, ["b"]),
        (("interactive",), [fl("b", "batch", started=True)], {}, []),
        (("batch",), [fl("a", "agent")], {}, []),
        (("agent",), [fl("a", "agent")], {}, []),
        ((), [fl("b", "batch")], {}, []),
        (("interactive",), [fl("b", "batch")], {"capacity": 1}, []),
        (("interactive",), [fl("b", "batch")], {"saturated": True}, []),
        (("interactive",), [fl("a", "agent"), fl("b", "batch")], {}, ["b"]),
        (("interactive",), [fl("b1", "batch", at=1.0), fl("b2", "batch", at=2.0)], {}, ["b2"]),
        (
            ("interactive", "interactive"),
            [fl("b1", "batch", at=1.0), fl("b2", "batch", at=2.0), fl("b3", "batch", at=3.0)],
            {},
            ["b3", "b2"],
        ),
        (
            ("interactive", "interactive"),
            [fl("b1", "batch"), fl("b2", "batch")],
            {"in_progress": 1},
            ["b1"],
        ),
        (("interactive",), [fl("b", "batch")], {"in_progress": 1}, []),
        (("agent", "interactive"), [fl("b", "batch"), fl("a", "agent")], {}, ["b"]),
        (
            ("interactive", "interactive"),
            [fl("b1", "batch"), fl("b2", "batch")],
            {"limit": 1},
            ["b1"],
        ),
    ],
    ids=[
        "lower-class-not-started",
        "started-streaming-never",
        "lower-class-waiting",
        "same-class-waiting",
        "nothing-waiting",
        "free-capacity",
        "saturated-fleet",
        "lowest-class-first",
        "most-recent-first",
        "one-per-waiting-request",
        "counts-pending-preemptions",
        "already-being-freed",
        "agent-victim-needs-interactive-above",
        "bounded-per-call",
    ],
)
def test_plan_preemptions(
    waiting: tuple[str, ...], in_flight: list[InFlight], kw: dict[str, object], expected: list[str]
) -> None:
    args: dict[str, object] = {"capacity": 0, "saturated": False, **kw}
    assert plan_preemptions(queue(*waiting), in_flight, **args) == expected  # type: ignore[arg-type]
