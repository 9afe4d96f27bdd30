"""Pure object master: placement, lifecycle, leases, pins, quotas, eviction, reclamation."""

from __future__ import annotations

import random

import pytest

from services.kvmeta.allocation import Candidate, FreeList, choose_segments
from services.kvmeta.objects import (
    AlreadyExistsError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    ObjectError,
    ObjectMaster,
    ReplicaConfig,
    ResourceExhaustedError,
    SegmentSpec,
)

CPU = 2
CFG = ReplicaConfig()


def seg(name: str, cap: int = 1000, tier: int = CPU) -> SegmentSpec:
    return SegmentSpec(name, f"inst-{name}", tier, cap, f"127.0.0.1:{1000 + len(name)}")


def master(*caps: int, **kw: object) -> ObjectMaster:
    om = ObjectMaster(**kw)  # type: ignore[arg-type]
    for n, cap in enumerate(caps):
        om.mount_segment("d", seg(f"s{n}", cap), 0.0)
    return om


def put(om: ObjectMaster, key: str, size: int = 100, now: float = 0.0, **cfg: object) -> None:
    om.put_start("d", "t", key, size, ReplicaConfig(**cfg), now)  # type: ignore[arg-type]
    om.put_end("d", "t", key, now)


@pytest.mark.parametrize(
    ("policy", "preferred", "expect"),
    [
        ("free_ratio_first", "", ["b", "c"]),
        ("local_first", "c", ["c", "b"]),
        ("local_first", "zz", ["b", "c"]),
    ],
    ids=["free-ratio", "local-first", "local-first-missing-falls-back"],
)
def test_policies(policy: str, preferred: str, expect: list[str]) -> None:
    cands = [Candidate("a", 50, 1000), Candidate("b", 900, 1000), Candidate("c", 400, 500)]
    assert choose_segments(policy, cands, 2, 100, preferred=preferred) == expect


def test_random_policy_picks_distinct_fitting_segments() -> None:
    cands = [Candidate(n, 500, 1000) for n in "abcd"] + [Candidate("tiny", 10, 1000)]
    picks = {
        tuple(choose_segments("random", cands, 2, 100, rng=random.Random(s))) for s in range(30)
    }
    assert all(len(set(p)) == 2 and "tiny" not in p for p in picks) and len(picks) > 1
    with pytest.raises(ValueError, match="unknown placement policy"):
        choose_segments("nope", cands, 1, 1)


def test_free_list_coalesces_and_reserves() -> None:
    fl = FreeList(100)
    a, b, c = fl.alloc(30), fl.alloc(30), fl.alloc(40)
    assert (a, b, c, fl.alloc(1)) == (0, 30, 60, None)
    fl.release(30, 30)
    fl.release(0, 30)
    assert fl.alloc(60) == 0 and fl.free == 0
    fl2 = FreeList(100)
    assert fl2.reserve(20, 10) and not fl2.reserve(25, 10) and fl2.alloc(20) == 0


@pytest.mark.parametrize(
    ("action", "error"),
    [
        (lambda om: om.put_end("d", "t", "nope", 0), NotFoundError),
        (lambda om: om.put_end("d", "t", "done", 0), FailedPreconditionError),
        (lambda om: om.put_revoke("d", "t", "done", 0), FailedPreconditionError),
        (lambda om: om.put_revoke("d", "t", "nope", 0), NotFoundError),
        (lambda om: om.remove("d", "t", "nope", 0), NotFoundError),
        (lambda om: om.remove("d", "t", "open", 0), FailedPreconditionError),
        (lambda om: om.put_start("d", "t", "done", 10, CFG, 0), AlreadyExistsError),
        (lambda om: om.put_start("d", "t", "open", 10, CFG, 0), AlreadyExistsError),
        (lambda om: om.put_start("d", "t", "", 10, CFG, 0), InvalidArgumentError),
        (lambda om: om.put_start("d", "t", "k", -1, CFG, 0), InvalidArgumentError),
        (
            lambda om: om.put_start("d", "t", "k", 10, ReplicaConfig(policy="x"), 0),
            InvalidArgumentError,
        ),
        (
            lambda om: om.put_start("d", "t", "k", 10, ReplicaConfig(replica_num=3), 0),
            ResourceExhaustedError,
        ),
        (lambda om: om.put_start("d", "t", "k", 5000, CFG, 0), ResourceExhaustedError),
        (lambda om: om.put_start("nodep", "t", "k", 10, CFG, 0), NotFoundError),
        (lambda om: om.get_replica_list("d", "t", "open", 0), NotFoundError),
        (lambda om: om.get_replica_list("d", "other", "done", 0), NotFoundError),
        (lambda om: om.mount_segment("d", seg("s0", 5), 0), AlreadyExistsError),
        (lambda om: om.mount_segment("d", seg("neg", -5), 0), InvalidArgumentError),
        (lambda om: om.unmount_segment("d", "nope", 0), NotFoundError),
        (lambda om: om.batch_put_start("d", "t", ["a", "a"], [1, 1], CFG, 0), InvalidArgumentError),
        (lambda om: om.batch_put_start("d", "t", ["a"], [1, 2], CFG, 0), InvalidArgumentError),
    ],
    ids=[
        "put-end-unknown",
        "double-put-end",
        "revoke-committed",
        "revoke-unknown",
        "remove-unknown",
        "remove-while-writing",
        "put-existing",
        "put-in-progress",
        "empty-key",
        "negative-size",
        "unknown-policy",
        "more-replicas-than-segments",
        "too-big",
        "unknown-deployment",
        "get-uncommitted",
        "tenant-isolated",
        "remount-different",
        "negative-capacity",
        "unmount-unknown",
        "batch-duplicates",
        "batch-length-mismatch",
    ],
)
def test_errors_leave_state_unchanged(action: object, error: type[ObjectError]) -> None:
    om = master(1000, 1000)
    put(om, "done")
    om.put_start("d", "t", "open", 100, CFG, 0)
    om.drain_changes()
    before = (om.usage("t"), [s.used_bytes for s in om.segments("d")])
    with pytest.raises(error):
        action(om)  # type: ignore[operator]
    assert (om.usage("t"), [s.used_bytes for s in om.segments("d")]) == before
    assert not om.drain_changes().objects


def test_lifecycle_and_lease_protected_remove() -> None:
    om = master(1000, 1000, lease_s=5.0)
    reps = om.put_start("d", "t", "k", 100, ReplicaConfig(replica_num=2), 0.0)
    assert {r.segment for r in reps} == {"s0", "s1"} and {r.status for r in reps} == {"processing"}
    assert om.exist("d", "t", ["k"]) == [False]
    om.put_end("d", "t", "k", 1.0)
    assert om.exist("d", "t", ["k", "x"]) == [True, False]
    got, lease = om.get_replica_list("d", "t", "k", 2.0)
    assert lease == 7.0 and {r.status for r in got} == {"complete"}
    with pytest.raises(FailedPreconditionError, match="leased"):
        om.remove("d", "t", "k", 6.9)
    om.remove("d", "t", "k", 7.0)
    assert om.usage("t") == 0 and [s.used_bytes for s in om.segments("d")] == [0, 0]


def test_batch_put_start_is_all_or_nothing() -> None:
    om = master(250)
    with pytest.raises(ResourceExhaustedError):
        om.batch_put_start("d", "t", ["a", "b", "c"], [100, 100, 100], CFG, 0.0)
    assert om.segments("d")[0].used_bytes == 0 and om.exist("d", "t", "abc") == [False] * 3
    res = om.batch_put_start("d", "t", ["a", "b"], [100, 100], CFG, 0.0)
    assert [len(r) for r in res] == [1, 1]
    om.batch_put_end("d", "t", ["a", "b"], 0.0)
    out = om.batch_get_replica_list("d", "t", ["a", "zz"], 0.0)
    assert isinstance(out[1], NotFoundError) and not isinstance(out[0], ObjectError)


def test_quota_refusal() -> None:
    om = master(10_000, quotas={"t": 250})
    put(om, "a")
    put(om, "b")
    with pytest.raises(ResourceExhaustedError, match="quota"):
        om.put_start("d", "t", "c", 100, CFG, 0.0)
    om.put_start("d", "other", "c", 100, CFG, 0.0)  # other tenants unaffected
    om.remove("d", "t", "a", 0.0)
    om.put_start("d", "t", "c", 100, CFG, 0.0)


@pytest.mark.parametrize(
    ("pins", "expect_left"),
    [
        ({}, ["k1", "k2", "k3", "k4"]),
        ({"k0": "hard"}, ["k0", "k2", "k3", "k4"]),
        ({"k0": "soft", "k1": "soft"}, ["k0", "k1", "k3", "k4"]),
        ({"k0": "hard", "k1": "hard", "k2": "hard", "k3": "hard"}, None),
    ],
    ids=["plain-lru", "hard-pin-survives", "soft-pins-evicted-last", "all-hard-pinned-no-space"],
)
def test_on_demand_eviction_respects_pins(
    pins: dict[str, str], expect_left: list[str] | None
) -> None:
    om = master(400)
    for n in range(4):
        kind = pins.get(f"k{n}")
        put(om, f"k{n}", now=float(n), soft_pin=kind == "soft", hard_pin=kind == "hard")
    if expect_left is None:
        with pytest.raises(ResourceExhaustedError):
            om.put_start("d", "t", "k4", 100, CFG, 10.0)
        return
    om.put_start("d", "t", "k4", 100, CFG, 10.0)
    om.put_end("d", "t", "k4", 10.0)
    present = [k for k in ["k0", "k1", "k2", "k3", "k4"] if om.exist("d", "t", [k])[0]]
    assert present == expect_left


def test_watermark_eviction_skips_leased_and_recent() -> None:
    om = master(1000, high_watermark=0.9, low_watermark=0.5, lease_s=100.0)
    for n in range(10):
        put(om, f"k{n}", now=float(n))
    om.get_replica_list("d", "t", "k0", 20.0)  # leased and most recent
    _, evicted = om.tick(21.0)
    assert [k for _, _, k in evicted] == ["k1", "k2", "k3", "k4", "k5"]
    assert om.exist("d", "t", ["k0", "k6"]) == [True, True]


def test_stuck_put_reclaimed_and_unmount_drops_replicas() -> None:
    om = master(1000, 1000, put_timeout_s=30.0)
    om.put_start("d", "t", "stuck", 100, CFG, 0.0)
    put(om, "two", replica_num=2)
    reclaimed, _ = om.tick(31.0)
    assert reclaimed == [("d", "t", "stuck")] and om.usage("t") == 200
    assert om.unmount_segment("d", "s0", 32.0) == 1
    assert om.exist("d", "t", ["two"]) == [True] and om.usage("t") == 100
    assert om.unmount_segment("d", "s1", 33.0) == 1
    assert om.exist("d", "t", ["two"]) == [False] and om.usage("t") == 0


def test_load_restores_allocations_from_changes() -> None:
    om = master(1000, 1000)
    put(om, "a", replica_num=2)
    om.put_start("d", "t", "b", 300, CFG, 0.0)
    ch = om.drain_changes()
    fresh = ObjectMaster()
    segs = [(d, s) for (d, _), s in ch.segments.items() if s is not None]
    fresh.load(segs, [o for o in ch.objects.values() if o is not None])
    assert [s.used_bytes for s in fresh.segments("d")] == [s.used_bytes for s in om.segments("d")]
    assert fresh.exist("d", "t", ["a", "b"]) == [True, False] and fresh.usage("t") == 500
    fresh.put_end("d", "t", "b", 1.0)


def test_requeued_changes_keep_newer_state() -> None:
    om = master(1000)
    put(om, "a")
    failed = om.drain_changes()  # say the write of these rows failed
    om.remove("d", "t", "a", 1.0)  # newer change of the same row
    put(om, "b")
    om.requeue_changes(failed)
    ch = om.drain_changes()
    assert ch.objects[("d", "t", "a")] is None  # the removal wins over the older upsert
    assert ch.objects[("d", "t", "b")] is not None
    assert ("d", "s0") in ch.segments  # the mount is written again
