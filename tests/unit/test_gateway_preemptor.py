"""The gateway's pre-emption shell: dispatch tasks, cancellation semantics, requeue signal."""

from __future__ import annotations

import asyncio

import pytest

from services.common.admission import QueuedRequest
from services.common.scheduling import CoreLimits, EndpointSpec, build_core
from services.scheduler.http.preemption import Preempted, Preemptor


def setup() -> tuple[Preemptor, asyncio.Event]:
    core = build_core(
        [EndpointSpec("e", "http://e")], limits=CoreLimits(max_in_flight_per_endpoint=1)
    )
    return Preemptor(core, lambda: 0.0), asyncio.Event()


async def wait_forever(gate: asyncio.Event) -> str:
    await gate.wait()
    return "answered"


async def test_lower_class_without_first_byte_is_preempted_for_a_waiting_higher_one() -> None:
    pre, gate = setup()
    run = asyncio.create_task(pre.run("b.0", "batch", wait_forever(gate)))
    await asyncio.sleep(0)
    assert pre.consider(0.0, 0) == []  # nothing waits yet
    pre.core.queue.offer(QueuedRequest("i", slo_class="interactive"), 0.0)
    assert pre.consider(0.0, 0) == ["b.0"]
    assert pre.consider(0.0, 0) == []  # already being freed
    with pytest.raises(Preempted):
        await run
    assert pre.total == 1 and len(pre) == 0


@pytest.mark.parametrize(
    ("cls", "started"),
    [("batch", True), ("interactive", False)],
    ids=["started-streaming", "top-class"],
)
async def test_never_preempted(cls: str, started: bool) -> None:
    pre, gate = setup()
    run = asyncio.create_task(pre.run("x.0", cls, wait_forever(gate)))
    await asyncio.sleep(0)
    if started:
        pre.started("x.0")
    pre.core.queue.offer(QueuedRequest("i", slo_class="interactive"), 0.0)
    assert pre.consider(0.0, 0) == []
    gate.set()
    assert await run == "answered" and pre.total == 0


async def test_the_callers_own_cancellation_is_not_a_preemption() -> None:
    pre, gate = setup()
    run = asyncio.create_task(pre.run("b.0", "batch", wait_forever(gate)))
    await asyncio.sleep(0)
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    assert pre.total == 0 and len(pre) == 0
