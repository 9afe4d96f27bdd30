"""Whether any engine can serve (the pure availability rule) and the admission gate's use of
it: a request no engine can serve is refused ``unavailable`` at once, and so are the
requests waiting in the queue when the last engine goes; busy engines still mean
``overloaded``."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from services.common.admission import ClassSpec, QueueConfig
from services.common.routing.types import EndpointSnapshot, EndpointView
from services.common.scheduling import CoreLimits, EndpointSpec, build_core
from services.common.scheduling.availability import no_engine
from services.scheduler.admission.gate import AdmissionGate
from services.scheduler.core.intake import Intake, Refused
from tests.helpers.waits import eventually


def ev(iid: str, role: Any = "worker", **kw: Any) -> EndpointView:
    return EndpointView(instance_id=iid, role=role, **kw)


@pytest.mark.parametrize(
    ("views", "decode_can_prefill", "exclude", "why"),
    [
        ([], True, (), "no engine is serving: none is registered"),
        ([ev("a")], True, (), None),
        ([ev("a", healthy=False), ev("b")], True, (), None),
        ([ev("a", circuit="half-open")], True, (), None),
        (
            [ev("a", healthy=False), ev("b", draining=True), ev("c", circuit="open")],
            True,
            (),
            "none of the 3 registered engines can (1 unhealthy, 1 draining, 1 circuit open)",
        ),
        ([ev("a"), ev("b")], True, ("a", "b"), "(2 excluded)"),
        ([ev("a"), ev("b")], True, ("a",), None),
        ([ev("d", "decode")], True, (), None),
        ([ev("d", "decode")], False, (), "1 decode without an eligible prefill engine"),
        ([ev("d", "decode"), ev("p", "prefill")], False, (), None),
        ([ev("d", "decode"), ev("w")], False, (), None),
        ([ev("p", "prefill")], True, (), "1 prefill without an eligible decode engine"),
        (
            [ev("p", "prefill"), ev("d", "decode", draining=True)],
            True,
            (),
            "none of the 2 registered engines can (1 draining, 1 prefill without",
        ),
    ],
    ids=[
        "empty",
        "one-worker",
        "one-of-two-healthy",
        "half-open-lets-through",
        "all-out",
        "all-excluded",
        "one-excluded",
        "decode-prefills",
        "decode-cannot-prefill",
        "decode-with-prefill",
        "worker-beside-decode",
        "prefill-only",
        "prefill-and-drained-decode",
    ],
)
def test_no_engine(
    views: list[EndpointView], decode_can_prefill: bool, exclude: tuple[str, ...], why: str | None
) -> None:
    got = no_engine(EndpointSnapshot(views), decode_can_prefill=decode_can_prefill, exclude=exclude)
    if why is None:
        assert got is None
    else:
        assert got is not None and got.startswith("no engine is serving") and why in got, got


def _gate(endpoints: list[EndpointSpec], max_queue_ms: float = 3_600_000.0) -> AdmissionGate:
    """A gate whose queue waits an hour (so an answer means a refusal, not a timeout) over
    engines that take one request each."""
    queue = QueueConfig(classes=(ClassSpec("agent", 20, max_queue_ms=max_queue_ms),))
    core = build_core(
        endpoints, perf_profile="test", queue=queue, limits=CoreLimits(max_in_flight_per_endpoint=1)
    )
    return AdmissionGate(core, lambda: 0.0, tick_s=3600.0)


def _intake(rid: str, **kw: Any) -> Intake:
    return Intake(request_id=rid, prompt_tokens=10, block_hashes=(), **kw)


@pytest.mark.parametrize(
    ("fleet", "exclude", "kind"),
    [
        ("empty", (), "unavailable"),
        ("drained", (), "unavailable"),
        ("unhealthy", (), "unavailable"),
        ("busy-but-excluded", ("e1",), "unavailable"),
        ("busy", (), "waits"),
    ],
    ids=["empty", "drained", "unhealthy", "busy-but-excluded", "busy"],
)
async def test_admission_refuses_at_once_when_no_engine_can_serve(
    fleet: str, exclude: tuple[str, ...], kind: str
) -> None:
    gate = _gate([] if fleet == "empty" else [EndpointSpec("e1", "http://127.0.0.1:1")])
    f = gate.core.fleet
    if fleet == "drained":
        f.set_draining("e1", True)
    elif fleet == "unhealthy":
        f.probe("e1", False, 0.0)
        f.probe("e1", False, 0.0)
    elif fleet.startswith("busy"):
        f.reserve("p0", ["e1"], {}, 0.0)  # the one slot is taken
    admit = gate.admit(_intake("r1", exclude=frozenset(exclude)), 0.0)
    if kind == "waits":
        task = asyncio.create_task(admit)
        await eventually(_queued(gate, 1))
        assert not task.done()
        await gate.close()
        with pytest.raises(Refused) as info:
            await task
        assert info.value.kind == "overloaded"
        return
    with pytest.raises(Refused) as info:
        await asyncio.wait_for(admit, 30)  # the queue would hold it for an hour
    assert info.value.kind == "unavailable"
    assert info.value.message.startswith("no engine is serving")
    assert len(gate.core.queue) == 0


def _queued(gate: AdmissionGate, n: int) -> Callable[[], Awaitable[bool]]:
    async def pred() -> bool:
        return len(gate.core.queue) == n

    return pred


@pytest.mark.parametrize("how", ["removed", "drained", "retired"])
async def test_waiting_requests_are_refused_when_the_last_engine_goes(how: str) -> None:
    gate = _gate([EndpointSpec("e1", "http://127.0.0.1:1")])
    f = gate.core.fleet
    f.reserve("p0", ["e1"], {}, 0.0)  # busy: the next requests wait
    waiting = [asyncio.create_task(gate.admit(_intake(f"r{i}"), 0.0)) for i in range(3)]
    await eventually(_queued(gate, 3))
    assert not any(t.done() for t in waiting)
    if how == "removed":
        f.remove("e1")
    elif how == "drained":
        f.set_draining("e1", True)
    else:
        f.retire("e1")  # in flight: drains until released
    gate.pump()  # what the gate's ticker, a release or the gateway's tick does
    done, _ = await asyncio.wait(waiting, timeout=30)  # the queue would hold them an hour
    assert done == set(waiting)
    for t in waiting:
        exc = t.exception()
        assert isinstance(exc, Refused) and exc.kind == "unavailable", exc
    assert len(gate.core.queue) == 0
    await gate.close()
