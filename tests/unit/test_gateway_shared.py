"""Active-active pure parts: routed-prefix entries and their application, in-flight
heartbeats (merge, expiry), and the fleet/core hooks they use."""

from __future__ import annotations

from dataclasses import replace

import pytest
from tideserve.v1 import events_pb2

from services.common.admission.shaper import DispatchShaper
from services.common.admission.shaper_config import ShaperConfig
from services.common.routing.types import Pick, RequestView
from services.common.scheduling import EndpointSpec, GatewayCore, build_core
from services.common.scheduling.fleet import Fleet
from services.common.scheduling.shared_state import (
    apply_carrier,
    apply_routed,
    approx_plugins,
    dead_replicas,
    heartbeat,
    merge_backlog,
    merge_in_flight,
    routed_entry,
    routed_plugins,
)
from services.common.tokens import block_hashes
from tests.helpers.views import request_view

IDS = ["a", "b", "c"]
HASHES = tuple(block_hashes(list(range(1, 257)), 16))  # 16 blocks


def core() -> GatewayCore:
    return build_core(
        [EndpointSpec(i, f"http://{i}") for i in IDS], perf_profile="test", block_size=16
    )


def view(rid: str = "r1", hashes: tuple[int, ...] = HASHES, **kw: object) -> RequestView:
    return request_view(rid, hashes=hashes, block_size=16, **kw)


def beat(replica: str, ts_ms: int, **inst: tuple[int, int]) -> events_pb2.ReplicaInFlight:
    return heartbeat(inst, deployment="d", replica_id=replica, ts_ms=ts_ms)


@pytest.mark.parametrize(
    ("beats", "expected"),
    [
        ([], {}),
        ([beat("me", 1000, a=(5, 50))], {}),
        ([beat("r2", 1000, a=(2, 30), b=(1, 0))], {"a": (2, 30), "b": (1, 0)}),
        ([beat("r2", 1000, a=(2, 30)), beat("r3", 900, a=(1, 5), c=(4, 0))],
         {"a": (3, 35), "c": (4, 0)}),
        ([beat("r2", 1000 - 3001, a=(2, 30))], {}),
        ([beat("r2", 1000 - 3000, a=(2, 30))], {"a": (2, 30)}),
        ([beat("r2", 1500, a=(1, 1))], {"a": (1, 1)}),
        ([beat("r2", 1000, a=(0, 0))], {}),
    ],
    ids=["none", "own-skipped", "other", "two-summed", "expired", "at-ttl", "future-skew",
         "idle-left-out"],
)  # fmt: skip
def test_merge_in_flight(
    beats: list[events_pb2.ReplicaInFlight], expected: dict[str, tuple[int, int]]
) -> None:
    assert merge_in_flight(beats, replica_id="me", now_ms=1000, ttl_ms=3000) == expected


def backlog_beat(replica: str, ts_ms: int, **ms: float) -> events_pb2.ReplicaInFlight:
    return heartbeat({}, deployment="d", replica_id=replica, ts_ms=ts_ms, backlog_ms=ms)


@pytest.mark.parametrize(
    ("beats", "expected"),
    [
        ([], {}),
        ([backlog_beat("me", 1000, a=900.0)], {}),
        ([backlog_beat("r2", 1000, a=900.0)], {"a": 900.0}),
        ([backlog_beat("r2", 800, a=900.0)], {"a": 700.0}),
        ([backlog_beat("r2", 800, a=150.0, b=400.0)], {"b": 200.0}),
        ([backlog_beat("r2", 1000, a=300.0), backlog_beat("r3", 900, a=300.0)], {"a": 500.0}),
        ([backlog_beat("r2", 1000 - 3001, a=9_000.0)], {}),
        ([backlog_beat("r2", 1500, a=100.0)], {"a": 100.0}),
    ],
    ids=["none", "own-skipped", "fresh", "counted-down-by-age", "run-out-left-out",
         "two-summed", "expired", "future-skew"],
)  # fmt: skip
def test_merge_backlog(beats: list[events_pb2.ReplicaInFlight], expected: dict[str, float]) -> None:
    got = merge_backlog(beats, replica_id="me", now_ms=1000, ttl_ms=3000)
    assert got == pytest.approx(expected)


def test_heartbeat_carries_the_backlog_of_instances_with_nothing_in_flight() -> None:
    b = heartbeat({"a": (1, 5)}, deployment="d", replica_id="r", ts_ms=5,
                  backlog_ms={"a": 20.0, "b": 300.0, "c": 0.0})  # fmt: skip
    got = [(i.instance_id, i.requests, i.dispatch_backlog_ms) for i in b.instances]
    assert got == [("a", 1, 20.0), ("b", 0, 300.0)]


def test_dead_replicas_only_long_expired() -> None:
    beats = [beat("alive", 100_000), beat("late", 95_000), beat("gone", 10_000)]
    assert dead_replicas(beats, now_ms=100_000, forget_ms=60_000) == ["gone"]


def test_routed_plugins_follow_the_profiles_of_the_pick() -> None:
    c = core()
    names = approx_plugins(c.scheduler)
    assert set(names) == {"prefix", "prefix-ready", "cache-aware-prefix"}
    d = c.pick(view(), 0.0, "p1")
    assert isinstance(d, Pick)
    assert routed_plugins(c.scheduler, d) == ["prefix"]
    d2 = c.pick(view("r2"), 0.0, "p2", profile="round_robin")
    assert isinstance(d2, Pick) and routed_plugins(c.scheduler, d2) == []
    d3 = c.pick(view("r3"), 0.0, "p3", profile="cache_aware")
    assert isinstance(d3, Pick) and routed_plugins(c.scheduler, d3) == ["cache-aware-prefix"]
    d4 = c.pick(view("r4"), 0.0, "p4", profile="prefix-ready")
    assert isinstance(d4, Pick) and routed_plugins(c.scheduler, d4) == ["prefix-ready"]


def entry(**kw: object) -> events_pb2.RoutedPrefix:
    base: dict[str, object] = {
        "deployment": "d",
        "replica_id": "other",
        "block_hashes": HASHES,
        "instance_ids": ["c"],
        "ts_ms": 100_000,
        "plugins": ["prefix"],
    }
    base.update(kw)
    return events_pb2.RoutedPrefix(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("msg", "applied", "matched"),
    [
        (entry(), True, {"c": 16}),
        (entry(instance_ids=["c", "b"]), True, {"c": 16, "b": 16}),
        (entry(replica_id="me"), False, {}),
        (entry(ts_ms=100_000 - 601_000), False, {}),
        (entry(plugins=["nope"]), False, {}),
        (entry(block_hashes=[]), False, {}),
        (entry(instance_ids=[]), False, {}),
    ],
    ids=["applied", "pd-both-instances", "own", "stale", "unknown-plugin", "no-hashes",
         "no-instances"],
)  # fmt: skip
def test_apply_routed(msg: events_pb2.RoutedPrefix, applied: bool, matched: dict[str, int]) -> None:
    c = core()
    plugins = approx_plugins(c.scheduler)
    ok = apply_routed(plugins, msg, replica_id="me", now=5.0, wall_ms=100_000, max_age_s=600.0)
    assert ok is applied
    assert plugins["prefix"].index.match(HASHES, 5.0) == matched
    assert plugins["cache-aware-prefix"].index.match(HASHES, 5.0) == {}


def test_routed_entry_skips_requests_without_hashes_or_plugins() -> None:
    c = core()
    d = c.pick(view(), 0.0, "p1")
    assert isinstance(d, Pick)
    args = {"deployment": "d", "replica_id": "me", "ts_ms": 7}
    assert routed_entry(view(hashes=()), d, ["prefix"], **args) is None  # type: ignore[arg-type]
    assert routed_entry(view(), d, [], **args) is None  # type: ignore[arg-type]
    e = routed_entry(view(), d, ["prefix"], **args)  # type: ignore[arg-type]
    assert e is not None
    assert list(e.instance_ids) == [d.decode.endpoint.instance_id]
    assert tuple(e.block_hashes) == HASHES and e.replica_id == "me" and e.ts_ms == 7


@pytest.mark.parametrize("share", [True, False], ids=["shared", "not-shared"])
def test_affinity_survives_losing_the_replica_that_routed(share: bool) -> None:
    """Replica A routes turn 1 to 'c'; replica B then routes turn 2 (a longer prompt with
    the same prefix). With A's entries applied, B sends it to 'c'; without, it does not."""
    a, b = core(), core()
    entries: list[events_pb2.RoutedPrefix] = []

    def listener(request: RequestView, pick: Pick, now: float) -> None:
        e = routed_entry(
            request,
            pick,
            routed_plugins(a.scheduler, pick),
            deployment="d",
            replica_id="A",
            ts_ms=1_000,
        )
        assert e is not None
        entries.append(e)

    a.pick_listeners.append(listener)
    d1 = a.pick(replace(view(), exclude=frozenset({"a", "b"})), 1.0, "t1")
    assert isinstance(d1, Pick) and d1.decode.endpoint.instance_id == "c"
    a.release("t1")
    assert len(entries) == 1
    if share:
        plugins = approx_plugins(b.scheduler)
        for e in entries:
            assert apply_routed(plugins, e, replica_id="B", now=2.0, wall_ms=1_500, max_age_s=600)
    turn2 = tuple(block_hashes(list(range(1, 257)) + list(range(900, 964)), 16))
    d2 = b.pick(view("t2", turn2), 3.0, "t2")
    assert isinstance(d2, Pick)
    assert (d2.decode.endpoint.instance_id == "c") is share
    assert (d2.predicted_cached_tokens == 256) is share


def test_fleet_adds_remote_in_flight_to_reservations() -> None:
    f = Fleet()
    for i in IDS:
        f.upsert(EndpointSpec(i, f"http://{i}"))
    f.reserve("p", ["a"], {"a": 100}, 0.0)
    assert f.own_in_flight() == {"a": (1, 100), "b": (0, 0), "c": (0, 0)}
    f.set_remote_in_flight({"a": (2, 40), "b": (3, 0), "zz": (9, 9)})
    snap = f.snapshot(0.0)
    got = {e.instance_id: (e.reserved_requests, e.reserved_tokens) for e in snap}
    assert got == {"a": (3, 140), "b": (3, 0), "c": (0, 0)}
    assert f.in_flight("a") == 1  # the dispatch bound stays per replica
    f.set_remote_in_flight({})
    assert f.view("b", 0.0).reserved_requests == 0


def test_heartbeat_leaves_idle_instances_out() -> None:
    b = heartbeat({"a": (0, 0), "b": (2, 10), "c": (0, -3)}, deployment="d", replica_id="r",
                  ts_ms=5)  # fmt: skip
    assert [(i.instance_id, i.requests, i.pending_prefill_tokens) for i in b.instances] == [
        ("b", 2, 10)
    ]


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"share_state": True}, "share_state: needs redis_url"),
        (
            {"share_heartbeat_s": 1.0, "share_heartbeat_ttl_s": 1.0},
            "share_heartbeat_ttl_s: must exceed",
        ),
    ],
    ids=["share-without-redis", "ttl-not-above-period"],
)
def test_integrations_refuse_settings_that_cannot_work(
    settings: dict[str, object], message: str
) -> None:
    from services.common.errors import StartupError
    from services.scheduler.feeds.integrations import Integrations
    from services.scheduler.http.server import Gateway
    from services.scheduler.settings import SchedulerSettings

    c = core()
    with pytest.raises(StartupError, match=message):
        Integrations(SchedulerSettings(**settings), c, Gateway(c))  # type: ignore[arg-type]


def test_integrations_off_without_redis_or_kvmeta() -> None:
    from services.scheduler.feeds.integrations import Integrations
    from services.scheduler.http.server import Gateway
    from services.scheduler.settings import SchedulerSettings

    c = core()
    gw = Gateway(c)
    x = Integrations(SchedulerSettings(replica_id="r1"), c, gw)
    assert (x.redis, x.sink, x.shared, x.lookup, gw.prefix_lookup) == (None,) * 5
    assert x.replica_id == "r1"


@pytest.mark.parametrize(
    ("steps", "matched"),
    [
        (["pick"], {"c": 16}),
        (["pick", "retract"], {}),
        (["retract"], {}),
        (["pick", "retract", "retract"], {}),
        (["pick", "local-refresh", "retract"], {"c": 16}),
        (["pick", "retract-other-request"], {"c": 16}),
    ],
    ids=["picked", "retracted", "retract-unknown", "retract-twice", "refreshed-stays",
         "other-request"],
)  # fmt: skip
def test_apply_routed_retraction(steps: list[str], matched: dict[str, int]) -> None:
    c = core()
    plugins = approx_plugins(c.scheduler)
    now = 5.0
    for step in steps:
        now += 1.0
        if step == "pick":
            msg = entry(request_id="q1")
        elif step == "retract":
            msg = entry(request_id="q1", retracted=True, block_hashes=[])
        elif step == "retract-other-request":
            msg = entry(request_id="q2", retracted=True, block_hashes=[])
        else:  # this replica routes the same prefix to the same instance itself
            d = c.pick(replace(view("local"), exclude=frozenset({"a", "b"})), now, "loc")
            assert isinstance(d, Pick) and d.decode.endpoint.instance_id == "c"
            continue
        assert apply_routed(plugins, msg, replica_id="me", now=now, wall_ms=100_000, max_age_s=600)
    assert plugins["prefix"].index.match(HASHES, now) == matched


def test_abandoned_pick_is_retracted_on_the_other_replica() -> None:
    a, b = core(), core()
    entries: list[events_pb2.RoutedPrefix] = []

    def publish(request: RequestView, pick: Pick, retracted: bool) -> None:
        e = routed_entry(
            request,
            pick,
            routed_plugins(a.scheduler, pick),
            deployment="d",
            replica_id="A",
            ts_ms=1_000,
            retracted=retracted,
        )
        assert e is not None
        entries.append(e)

    a.pick_listeners.append(lambda r, p, now: publish(r, p, False))
    a.settle_listeners.append(lambda r, p, ok: None if ok else publish(r, p, True))
    d = a.pick(replace(view(), exclude=frozenset({"a", "b"})), 1.0, "t1")
    assert isinstance(d, Pick)
    assert a.abandon("t1") and a.release("t1")
    assert [e.retracted for e in entries] == [False, True]
    assert entries[1].request_id == entries[0].request_id == "r1" and not entries[1].block_hashes
    plugins = approx_plugins(b.scheduler)
    for e in entries:
        assert apply_routed(plugins, e, replica_id="B", now=2.0, wall_ms=1_500, max_age_s=600)
    assert plugins["prefix"].index.match(HASHES, 2.0) == {}
    assert a.scheduler.profiles["default"].post_pick  # sanity: the plugin took part


def test_entries_announce_the_pick_as_a_carrier_and_its_answer() -> None:
    c = core()
    d = c.pick(view(), 0.0, "p1")
    assert isinstance(d, Pick)
    args = {"deployment": "d", "replica_id": "me", "ts_ms": 7}
    e = routed_entry(view(), d, ["prefix"], **args)  # type: ignore[arg-type]
    assert e is not None and e.prefill_ms == d.predicted_prefill_ms > 0
    assert e.cached_blocks == d.predicted_cached_tokens // 16 and not e.answered
    done = routed_entry(view(), d, ["prefix"], answered=True, **args)  # type: ignore[arg-type]
    assert done is not None and done.answered and not done.block_hashes
    assert done.request_id == "r1" and done.prefill_ms == 0
    plugins = approx_plugins(c.scheduler)
    # an answer changes no routed prefix
    assert not apply_routed(plugins, done, replica_id="other", now=1.0, wall_ms=7, max_age_s=60)


@pytest.mark.parametrize(
    ("first", "second", "held_after"),
    [
        (entry(request_id="t1", prefill_ms=3_000.0), entry(request_id="t1", answered=True), 0),
        (entry(request_id="t1", prefill_ms=3_000.0), entry(request_id="t1", retracted=True), 0),
        (entry(request_id="t1", prefill_ms=3_000.0), entry(request_id="t2", answered=True), 1),
        (entry(request_id="t1", prefill_ms=3_000.0), entry(request_id="t1", replica_id="x",
                                                          answered=True), 1),
        (entry(request_id="t1", prefill_ms=0.0), None, 0),
        (entry(request_id="t1", prefill_ms=3_000.0, replica_id="me"), None, 0),
        (entry(request_id="", prefill_ms=3_000.0), None, 0),
        (entry(request_id="t1", prefill_ms=3_000.0, instance_ids=["a", "c"]), None, 1),
        (entry(request_id="t1", prefill_ms=3_000.0, instance_ids=["c", "a"]), None, 0),
    ],
    ids=["answered", "retracted", "another-pick-answered", "same-id-other-replica",
         "no-carrier", "own", "no-request-id", "pd-prefill-instance", "pd-decode-instance"],
)  # fmt: skip
def test_apply_carrier(
    first: events_pb2.RoutedPrefix, second: events_pb2.RoutedPrefix | None, held_after: int
) -> None:
    """Another replica's pick holds this one's request for the same prefix on the instance
    that computes it (the last of instance_ids) until the pick's answer or retraction."""
    s = DispatchShaper(ShaperConfig(hold_above_ms=150.0, follow_max_ms=30_000.0))
    assert apply_carrier(s, first, replica_id="me", now=5.0, wall_ms=100_000) == {}
    held = not s.offer("f", "c", 5.0, 5.1, prefix=(*HASHES, 77))
    go = apply_carrier(s, second, replica_id="me", now=6.0, wall_ms=101_000) if second else {}
    assert int(held) - sum(len(v) for v in go.values()) == held_after
    assert s.held("c") == held_after
