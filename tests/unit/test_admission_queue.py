"""Admission queue discipline: priority, DRR fairness, EDF, starvation, bounds, expiry,
shedding with retry hints, requeue and pre-emption, saturation."""

from __future__ import annotations

import pytest

from services.common.admission import (
    AdmissionQueue,
    Admitted,
    ClassSpec,
    InFlight,
    QueueConfig,
    QueuedRequest,
    Shed,
    choose_preemption,
    saturated,
)

CLASSES = (
    ClassSpec("interactive", 30, max_queue_ms=1_000, max_queued=3),
    ClassSpec("agent", 20, max_queue_ms=10_000, starve_after_ms=5_000),
    ClassSpec("batch", 10, max_queue_ms=100_000, starve_after_ms=20_000),
)


def q(**kw: object) -> AdmissionQueue:
    kw.setdefault("classes", CLASSES)
    kw.setdefault("quantum", 10)
    return AdmissionQueue(QueueConfig(**kw))  # type: ignore[arg-type]


def r(
    rid: str, cls: str = "agent", tenant: str = "", cost: int = 10, deadline: float | None = None
) -> QueuedRequest:
    return QueuedRequest(rid, tenant=tenant, slo_class=cls, cost=cost, deadline=deadline)


def ids(reqs: list[QueuedRequest]) -> list[str]:
    return [x.request_id for x in reqs]


@pytest.mark.parametrize(
    ("offers", "capacity", "expected"),
    [
        ([r("b1", "batch"), r("a1"), r("i1", "interactive")], 3, ["i1", "a1", "b1"]),
        ([r("a1"), r("a2"), r("a3")], 2, ["a1", "a2"]),  # FIFO, bounded by capacity
        ([r("b1", "batch"), r("b2", "batch")], 5, ["b1", "b2"]),
        ([r("x", "")], 1, ["x"]),  # "" = default class
        ([], 4, []),
    ],
    ids=["strict-priority", "fifo-capacity", "same-class", "default-class", "empty"],
)
def test_priority_and_fifo(offers: list[QueuedRequest], capacity: int, expected: list[str]) -> None:
    aq = q()
    for o in offers:
        assert isinstance(aq.offer(o, 0.0), Admitted)
    assert ids(aq.next(0.0, capacity)) == expected


@pytest.mark.parametrize(
    ("weights", "reqs", "n", "expected_share"),
    [
        ({}, [("A", 10)] * 20 + [("B", 10)] * 20, 20, {"A": 10, "B": 10}),
        ({"A": 3.0}, [("A", 10)] * 40 + [("B", 10)] * 40, 20, {"A": 15, "B": 5}),
        ({}, [("A", 40)] * 20 + [("B", 10)] * 40, 25, {"A": 5, "B": 20}),  # token-fair
    ],
    ids=["equal", "weighted-3-to-1", "cost-aware"],
)
def test_drr_fairness_between_tenants(
    weights: dict[str, float], reqs: list[tuple[str, int]], n: int, expected_share: dict[str, int]
) -> None:
    aq = q(tenant_weights=weights)
    for i, (tenant, cost) in enumerate(reqs):
        aq.offer(r(f"{tenant}{i}", tenant=tenant, cost=cost), 0.0)
    got = aq.next(0.0, n)
    share = {t: sum(1 for x in got if x.tenant == t) for t in expected_share}
    assert share == expected_share


def test_heavy_tenant_cannot_block_light_tenant() -> None:
    aq = q()
    for i in range(100):
        aq.offer(r(f"h{i}", tenant="heavy"), 0.0)
    aq.offer(r("light", tenant="light"), 0.0)
    assert "light" in ids(aq.next(0.0, 2))


def test_edf_within_tenant_then_fifo() -> None:
    aq = q()
    aq.offer(r("nodl"), 0.0)
    aq.offer(r("late", deadline=9.0), 0.0)
    aq.offer(r("soon", deadline=3.0), 0.0)
    assert ids(aq.next(0.0, 3)) == ["soon", "late", "nodl"]


@pytest.mark.parametrize(
    ("now", "expected"),
    [
        (1.0, ["i1", "a1", "b1"]),  # nobody starved
        (6.0, ["a1", "i1", "b1"]),  # agent waited 6 s >= 5 s: promoted
        (25.0, ["b1", "a1", "i1"]),  # both starved: oldest first (b1 arrived first)
    ],
    ids=["none", "agent-promoted", "oldest-promoted-first"],
)
def test_starvation_promotion(now: float, expected: list[str]) -> None:
    aq = q(
        classes=(
            ClassSpec("interactive", 30, max_queue_ms=100_000),
            ClassSpec("agent", 20, max_queue_ms=100_000, starve_after_ms=5_000),
            ClassSpec("batch", 10, max_queue_ms=100_000, starve_after_ms=20_000),
        )
    )
    aq.offer(r("b1", "batch"), -0.5)
    aq.offer(r("a1"), 0.0)
    aq.offer(r("i1", "interactive"), now - 0.1)
    assert ids(aq.next(now, 3)) == expected


def test_class_bound_sheds_with_retry_hint_and_other_classes_still_admitted() -> None:
    aq = q()
    for i in range(3):
        assert isinstance(aq.offer(r(f"i{i}", "interactive"), 0.0), Admitted)
    shed = aq.offer(r("i3", "interactive"), 0.0)
    assert isinstance(shed, Shed) and "queue full" in shed.reason
    assert shed.retry_after_ms == 60_000  # no release rate measured yet: the cap
    assert isinstance(aq.offer(r("a1"), 0.0), Admitted)


def test_total_bound() -> None:
    aq = q(max_total=2)
    aq.offer(r("a"), 0.0)
    aq.offer(r("b", "batch"), 0.0)
    assert isinstance(aq.offer(r("c", "interactive"), 0.0), Shed)


def test_retry_hint_follows_release_rate() -> None:
    aq = q()
    for i in range(3):
        aq.offer(r(f"i{i}", "interactive"), 0.0)
    aq.next(0.0, 1)
    aq.next(1.0, 2)  # 2 released in 1 s → 2/s
    for i in range(3, 6):
        aq.offer(r(f"i{i}", "interactive"), 1.0)
    shed = aq.offer(r("i9", "interactive"), 1.0)
    assert isinstance(shed, Shed) and shed.retry_after_ms == 1500  # 3 ahead at 2/s


@pytest.mark.parametrize(
    ("now", "expired"),
    [
        (0.5, []),
        (1.5, ["i1"]),  # interactive max_queue 1 s
        (4.0, ["i1", "dl"]),  # deadline 3.0 passed
        (11.0, ["i1", "dl", "a1"]),
    ],
    ids=["none", "class-timeout", "deadline", "agent-timeout"],
)
def test_expire(now: float, expired: list[str]) -> None:
    aq = q()
    aq.offer(r("i1", "interactive"), 0.0)
    aq.offer(r("dl", "batch", deadline=3.0), 0.0)
    aq.offer(r("a1"), 0.5)
    assert sorted(ids(aq.expire(now))) == sorted(expired)
    assert aq.expire(now) == []
    assert len(aq) == 3 - len(expired)


def test_offer_with_passed_deadline_is_shed_and_duplicate_refused() -> None:
    aq = q()
    assert isinstance(aq.offer(r("x", deadline=1.0), 2.0), Shed)
    aq.offer(r("y"), 0.0)
    with pytest.raises(ValueError, match="already queued"):
        aq.offer(r("y"), 0.0)
    with pytest.raises(KeyError):
        aq.offer(r("z", "platinum"), 0.0)


def test_cancel() -> None:
    aq = q()
    aq.offer(r("a"), 0.0)
    assert aq.cancel("a") and not aq.cancel("a") and len(aq) == 0


def test_requeue_keeps_place_and_ignores_bounds() -> None:
    aq = q()
    for i in range(3):
        aq.offer(r(f"i{i}", "interactive"), 0.0)
    (first,) = aq.next(0.0, 1)
    aq.offer(r("i3", "interactive"), 0.1)
    aq.requeue(first, 0.0)  # class is full (3) but requeue is never refused
    assert len(aq) == 4
    assert ids(aq.next(0.2, 1)) == ["i0"]


@pytest.mark.parametrize(
    ("waiting", "in_flight", "expected"),
    [
        ([], [InFlight("b", 10, False, 0.0)], None),
        (["interactive"], [InFlight("b", 10, False, 0.0)], "b"),
        (["interactive"], [InFlight("b", 10, True, 0.0)], None),  # already streaming
        (["batch"], [InFlight("a", 20, False, 0.0)], None),  # not lower
        (["interactive"], [InFlight("a", 20, False, 0.0), InFlight("b", 10, False, 0.0)], "b"),
        (["interactive"], [InFlight("b1", 10, False, 1.0), InFlight("b2", 10, False, 2.0)], "b2"),
    ],
    ids=[
        "nothing-waiting",
        "preempt-lower",
        "streaming-protected",
        "same-or-higher",
        "lowest-first",
        "newest-first",
    ],
)
def test_choose_preemption(
    waiting: list[str], in_flight: list[InFlight], expected: str | None
) -> None:
    aq = q()
    for i, c in enumerate(waiting):
        aq.offer(r(f"w{i}", c), 0.0)
    assert choose_preemption(aq, in_flight) == expected


@pytest.mark.parametrize(
    ("loads", "expected"),
    [
        ([], True),
        ([(0.5, 0)], False),
        ([(0.95, 0), (0.5, 0)], False),
        ([(0.95, 0), (0.5, 10)], True),
        ([(0.91, 0), (0.92, 0)], True),
    ],
    ids=["empty-fleet", "idle", "one-free", "all-over-some-threshold", "all-kv-full"],
)
def test_saturated(loads: list[tuple[float, int]], expected: bool) -> None:
    assert saturated(loads, kv_threshold=0.9, waiting_threshold=8) is expected


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"classes": ()}, "non-empty and unique"),
        ({"default_class": "gold"}, "default_class"),
        ({"quantum": 0}, "quantum"),
        ({"tenant_weights": {"t": 0}}, "tenant weight"),
    ],
    ids=["no-classes", "bad-default", "quantum", "weight"],
)
def test_bad_config(kw: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        QueueConfig(**kw)  # type: ignore[arg-type]


def _due(spec: dict[str, ClassSpec], entries: dict[str, tuple[QueuedRequest, float]],
         now: float) -> list[str]:  # fmt: skip
    """The expiry rule, by brute force over what is queued: ids in (arrival, offer) order."""
    dead = [
        (arrival, i, rid)
        for i, (rid, (r, arrival)) in enumerate(entries.items())
        if (now - arrival) * 1000.0 > spec[r.slo_class or "agent"].max_queue_ms
        or (r.deadline is not None and r.deadline <= now)
    ]
    return [rid for *_, rid in sorted(dead)]


@pytest.mark.parametrize("seed", [1, 2, 3, 4], ids=["seed-1", "seed-2", "seed-3", "seed-4"])
def test_expiry_and_starvation_follow_the_rules_through_any_sequence(seed: int) -> None:
    """Random offers (with and without deadlines), releases, cancellations and expiry over
    a long queue: every expire() returns exactly what the rule says, and a release gives the
    oldest starved request first whenever one exists (the queue's indexes never drift)."""
    import random

    rng = random.Random(seed)
    queue = q(max_total=100_000)
    spec = {c.name: c for c in CLASSES}
    queued: dict[str, tuple[QueuedRequest, float]] = {}  # insertion order = offer order
    now = 0.0
    for i in range(3000):
        now += rng.random() * 0.05
        op = rng.random()
        if op < 0.6:
            cls = rng.choice(["agent", "batch", "interactive", ""])
            dl = now + rng.random() * 8 if rng.random() < 0.3 else None
            r = QueuedRequest(f"r{i}", rng.choice(["a", "b"]), cls, 1, dl)
            if isinstance(queue.offer(r, now), Admitted):
                queued[r.request_id] = (r, now)
        elif op < 0.75 and queued:
            rid = rng.choice(list(queued))
            assert queue.cancel(rid)
            del queued[rid]
        elif op < 0.9:
            expected = _due(spec, queued, now)
            assert [r.request_id for r in queue.expire(now)] == expected
            for rid in expected:
                del queued[rid]
        else:
            starved = [
                (arrival, rid)
                for rid, (r, arrival) in queued.items()
                if (lim := spec[r.slo_class or "agent"].starve_after_ms)
                and (now - arrival) * 1000.0 >= lim
            ]
            out = queue.next(now, 1)
            if starved:
                assert [r.request_id for r in out] == [min(starved)[1]]
            for r in out:
                del queued[r.request_id]
        assert len(queue) == len(queued)
