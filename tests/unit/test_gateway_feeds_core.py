"""Membership events and load snapshots applied to the fleet (pure functions)."""

from __future__ import annotations

import pytest
from tideserve.v1 import common_pb2, events_pb2

from services.common.scheduling.fleet import EndpointSpec, Fleet
from services.scheduler.feeds.load_stream import apply_snapshot, load_report
from services.scheduler.feeds.membership import apply_event

ME = events_pb2.MembershipEvent
S = common_pb2


def _ev(
    kind: int,
    iid: str = "e9",
    url: str = "http://127.0.0.1:30009",
    state: int = S.INSTANCE_STATE_READY,
    role: int = S.ROLE_WORKER,
    deployment: str = "dep",
    bootstrap_port: int = 0,
) -> events_pb2.MembershipEvent:
    return ME(
        kind=kind,  # type: ignore[arg-type]
        instance=S.Instance(
            instance_id=iid,
            deployment=deployment,
            role=role,  # type: ignore[arg-type]
            state=state,  # type: ignore[arg-type]
            endpoint=S.Endpoint(url=url, bootstrap_port=bootstrap_port),
            labels={"zone": "a"},
        ),
        reason="test",
    )


def _fleet() -> Fleet:
    f = Fleet()
    f.upsert(EndpointSpec("127.0.0.1:30001", "http://127.0.0.1:30001", deployment="dep"))
    return f


@pytest.mark.parametrize(
    ("event", "result", "ids", "eligible"),
    [
        (_ev(ME.KIND_ADDED), "ready", ["127.0.0.1:30001", "e9"], {"e9": True}),
        (
            _ev(ME.KIND_ADDED, state=S.INSTANCE_STATE_UNSPECIFIED, role=S.ROLE_UNSPECIFIED),
            "ready",
            ["127.0.0.1:30001", "e9"],
            {"e9": True},
        ),
        (
            _ev(ME.KIND_ADDED, state=S.INSTANCE_STATE_STARTING),
            "starting",
            ["127.0.0.1:30001", "e9"],
            {"e9": False},
        ),
        (
            _ev(ME.KIND_ADDED, iid="autoscaler-7", url="http://127.0.0.1:30001/"),
            "ready",
            ["127.0.0.1:30001"],
            {"127.0.0.1:30001": True},
        ),
        (
            _ev(ME.KIND_STATE_CHANGED, iid="127.0.0.1:30001", state=S.INSTANCE_STATE_DRAINING),
            "draining",
            ["127.0.0.1:30001"],
            {"127.0.0.1:30001": False},
        ),
        (_ev(ME.KIND_STATE_CHANGED, state=S.INSTANCE_STATE_DRAINING), "unknown", None, {}),
        (_ev(ME.KIND_REMOVED, iid="127.0.0.1:30001"), "removed", [], {}),
        (
            _ev(
                ME.KIND_STATE_CHANGED,
                iid="x",
                url="http://127.0.0.1:30001",
                state=S.INSTANCE_STATE_FAILED,
            ),
            "removed",
            [],
            {},
        ),
        (_ev(ME.KIND_REMOVED), "unknown", None, {}),
        (_ev(ME.KIND_ADDED, deployment="other"), "other_deployment", None, {}),
        (_ev(ME.KIND_ADDED, role=S.ROLE_KVCACHE), "bad_role", None, {}),
        (_ev(ME.KIND_ADDED, url=""), "no_url", None, {}),
        (_ev(ME.KIND_UNSPECIFIED), "bad_kind", None, {}),
    ],
    ids=[
        "added-ready",
        "added-unspecified-is-ready-worker",
        "added-starting-not-eligible",
        "same-url-is-the-static-endpoint",
        "draining",
        "draining-unknown-ignored",
        "removed",
        "failed-by-url",
        "removed-unknown",
        "other-deployment",
        "kvcache-role",
        "no-url",
        "unspecified-kind",
    ],
)
def test_apply_event(
    event: events_pb2.MembershipEvent,
    result: str,
    ids: list[str] | None,
    eligible: dict[str, bool],
) -> None:
    f = _fleet()
    assert apply_event(f, event, deployment="dep") == result
    assert f.ids() == (ids if ids is not None else ["127.0.0.1:30001"])
    for iid, ok in eligible.items():
        assert f.view(iid, 0.0).eligible is ok


def test_added_carries_role_bootstrap_and_labels_and_undrains() -> None:
    f = _fleet()
    ev = _ev(ME.KIND_ADDED, role=S.ROLE_PREFILL, bootstrap_port=8998)
    apply_event(f, ev, deployment="dep")
    s = f.spec("e9")
    assert (s.role, s.bootstrap_port, dict(s.labels), s.deployment) == (
        "prefill",
        8998,
        {"zone": "a"},
        "dep",
    )
    draining = _ev(ME.KIND_STATE_CHANGED, state=S.INSTANCE_STATE_DRAINING)
    assert apply_event(f, draining, deployment="dep") == "draining"
    assert apply_event(f, _ev(ME.KIND_STATE_CHANGED), deployment="dep") == "ready"
    assert f.view("e9", 0.0).eligible


def test_removed_with_in_flight_retires_until_released() -> None:
    f = _fleet()
    f.reserve("p", ["127.0.0.1:30001"], {}, 0.0)
    ev = _ev(ME.KIND_REMOVED, iid="127.0.0.1:30001")
    assert apply_event(f, ev, deployment="dep") == "retiring"
    assert not f.view("127.0.0.1:30001", 0.0).eligible
    f.release("p")
    assert f.ids() == []


def _snap(
    iid: str = "127.0.0.1:30001",
    epoch: int = 1,
    ts: int = 100,
    url: str = "",
    deployment: str = "dep",
) -> events_pb2.LoadSnapshot:
    return events_pb2.LoadSnapshot(
        deployment=deployment,
        instance_id=iid,
        epoch=epoch,
        ts_ms=ts,
        num_running=3,
        num_waiting=2,
        kv_usage=0.5,
        tokens_in_flight=700,
        pending_prefill_tokens=120,
        prefill_tokens_per_s=9000.0,
        decode_tokens_per_s=400.0,
        endpoint=S.Endpoint(url=url),
    )


@pytest.mark.parametrize(
    ("snaps", "results"),
    [
        ([_snap()], ["applied"]),
        ([_snap(), _snap(ts=99)], ["applied", "stale"]),
        ([_snap(), _snap()], ["applied", "stale"]),
        ([_snap(ts=500), _snap(epoch=2, ts=1)], ["applied", "applied"]),
        ([_snap(iid="eng-1", url="http://127.0.0.1:30001")], ["applied"]),
        ([_snap(iid="eng-1", url="http://127.0.0.1:30002")], ["unknown"]),
        ([_snap(deployment="other")], ["other_deployment"]),
    ],
    ids=["fresh", "older", "repeat", "restarted", "by-url", "unknown", "other-deployment"],
)
def test_apply_snapshot(snaps: list[events_pb2.LoadSnapshot], results: list[str]) -> None:
    f = _fleet()
    assert [apply_snapshot(f, s, deployment="dep", now=1.0) for s in snaps] == results
    if "applied" in results:
        v = f.view("127.0.0.1:30001", 1.0)
        assert (v.running, v.waiting, v.tokens_in_flight, v.pending_prefill_tokens) == (
            3,
            2,
            700,
            120,
        )
        assert (v.kv_usage, v.prefill_tokens_per_s) == (0.5, 9000.0)
        assert f.load_source("127.0.0.1:30001", 1.0) == "stream"


def test_load_report_clamps() -> None:
    r = load_report(events_pb2.LoadSnapshot(num_running=-1, kv_usage=1.5, decode_tokens_per_s=5))
    assert (r.running, r.kv_usage, r.decode_tokens_per_s) == (0, 1.0, 5.0)
