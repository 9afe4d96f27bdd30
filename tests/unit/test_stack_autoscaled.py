"""`up`'s wait for its engines (services.stack.autoscaled): the pure verdict on one look at
ListInstances and the gateways, and start_engines over fake calls (no gRPC, no sleeping: the
pause and the clock are injected)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import grpc
import pytest

from services.stack.autoscaled import (
    EngineOps,
    EnginesFailed,
    EngineView,
    engines_progress,
    start_engines,
)


def _v(iid: str, state: str) -> EngineView:
    return EngineView(iid, state, f"http://h/{iid}")


@pytest.mark.parametrize(
    ("views", "want", "routed", "ready", "failed", "summary"),
    [
        ([], 2, None, False, (), "engines: none yet of 2"),
        ([_v("e1", "ready"), _v("e2", "starting")], 2, None, False, (), "1 ready, 1 starting"),
        ([_v("e1", "ready"), _v("e2", "ready")], 2, None, True, (), "2 ready of 2"),
        ([_v("e1", "ready"), _v("e2", "ready")], 2, [{"e1", "e2"}, {"e1"}], False, (),
         "a gateway does not route to e2 yet"),
        ([_v("e1", "ready"), _v("e2", "ready")], 2, [{"e1", "e2"}] * 2, True, (), "2 ready"),
        ([_v("e1", "ready"), _v("e2", "failed")], 2, None, False, ("e2",), "1 failed, 1 ready"),
        # an earlier run's count is above the flags' until ScaleRole's drain is done: enough
        ([_v("e1", "ready"), _v("e2", "ready"), _v("e3", "draining")], 2, None, True, (), ""),
    ],
    ids=["nothing-yet", "one-starting", "all-ready", "gateway-behind", "routed-everywhere",
         "one-failed", "more-than-wanted"],
)  # fmt: skip
def test_engines_progress(
    views: list[EngineView],
    want: int,
    routed: list[set[str]] | None,
    ready: bool,
    failed: tuple[str, ...],
    summary: str,
) -> None:
    got = engines_progress(views, want, routed)
    assert (got.ready, got.failed) == (ready, failed)
    assert summary in got.summary


SPEC: Mapping[str, Any] = {"name": "d", "roles": [{"name": "engine", "replicas": 2}]}


class FakeCalls:
    """ListInstances answers from ``looks`` in turn (the last one repeats)."""

    def __init__(self, looks: list[list[EngineView]], refuse: Exception | None = None) -> None:
        self.looks = looks
        self.refuse = refuse
        self.applied: list[tuple[str, Mapping[str, Any]]] = []
        self.t = 0.0

    def ops(self) -> EngineOps:
        def apply(address: str, spec: Mapping[str, Any], timeout_s: float) -> None:
            if self.refuse is not None:
                raise self.refuse
            self.applied.append((address, spec))

        def instances(address: str, name: str, timeout_s: float) -> list[EngineView]:
            return self.looks.pop(0) if len(self.looks) > 1 else self.looks[0]

        def routed(address: str, name: str, timeout_s: float) -> set[str]:
            return {"e1", "e2"}

        return EngineOps(apply, instances, routed)

    def run(self, timeout_s: float = 10.0) -> list[EngineView]:
        def pause(s: float) -> None:
            self.t += s

        return start_engines(
            self.ops(),
            autoscaler="as:1",
            gateways=["gw:1"],
            spec=SPEC,
            timeout_s=timeout_s,
            rpc_timeout_s=1.0,
            pause=pause,
            clock=lambda: self.t,
        )


def test_start_engines_applies_then_waits_until_ready_and_routed() -> None:
    calls = FakeCalls([[_v("e1", "starting")], [_v("e1", "ready"), _v("e2", "ready")]])
    views = calls.run()
    assert calls.applied == [("as:1", SPEC)]
    assert [v.instance_id for v in views] == ["e1", "e2"]


class _Refused(grpc.RpcError, grpc.Call):  # type: ignore[misc]
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.INVALID_ARGUMENT

    def details(self) -> str:
        return "roles[0]: bad"


@pytest.mark.parametrize(
    ("calls", "needle"),
    [
        (FakeCalls([[]], refuse=_Refused()), "refused the stack's deployment: INVALID_ARGUMENT"),
        (FakeCalls([[]], refuse=ValueError("ports repeat")), "deployment is invalid: ports"),
        (FakeCalls([[_v("e1", "ready"), _v("e2", "failed")]]), "engine e2 failed to start"),
        (FakeCalls([[_v("e1", "starting")]]), "not ready within 10s: engines: 1 starting of 2"),
    ],
    ids=["refused-by-the-autoscaler", "refused-locally", "engine-died", "timeout"],
)
def test_start_engines_fails_in_one_line(calls: FakeCalls, needle: str) -> None:
    with pytest.raises(EnginesFailed) as info:
        calls.run()
    assert needle in str(info.value)
    assert "\n" not in str(info.value)
