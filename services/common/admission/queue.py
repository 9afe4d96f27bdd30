"""Admission queue (pure core): SLO classes, per-tenant fairness, deadlines, shedding.

Discipline, in order of precedence, when :meth:`AdmissionQueue.next` releases requests:

1. Starvation promotion: a queued request that has waited at least its class's
   ``starve_after_ms`` goes first (oldest promoted first), whatever its class.
2. Strict priority between classes (higher ``priority`` first, e.g. interactive > agent >
   batch).
3. Inside a class, tenants share by deficit round-robin: each visit credits a tenant
   ``quantum * tenant weight`` cost units; a request is released when its tenant's deficit
   covers its ``cost`` (default: prompt tokens). A tenant whose queue empties loses its credit.
4. Inside a tenant, earliest deadline first for requests that carry one, then FIFO.

Bounds: each class holds at most ``max_queued`` requests (an offer beyond it is shed, and
so is any offer while the total across classes is at ``max_total``); a request waiting longer
than its class's ``max_queue_ms``, or past its deadline, is returned by :meth:`expire`.
Shedding carries ``retry_after_ms`` estimated from the queue depth and the recent release
rate. Requests released but not yet streaming may be put back with :meth:`requeue` (lower
classes pre-empted before their first byte; see :func:`choose_preemption`).

Time is always a parameter (seconds, any monotonic origin); nothing here reads a clock.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class ClassSpec:
    name: str
    priority: int
    max_queue_ms: float = 30_000.0
    max_queued: int = 10_000
    # Promote to the front after waiting this long; 0 = never.
    starve_after_ms: float = 0.0


@dataclass(frozen=True, slots=True)
class QueueConfig:
    classes: tuple[ClassSpec, ...] = (
        ClassSpec("interactive", 30, max_queue_ms=5_000.0),
        ClassSpec("agent", 20, max_queue_ms=30_000.0, starve_after_ms=10_000.0),
        ClassSpec("batch", 10, max_queue_ms=300_000.0, starve_after_ms=60_000.0),
    )
    default_class: str = "agent"
    tenant_weights: Mapping[str, float] = field(default_factory=dict)
    default_tenant_weight: float = 1.0
    quantum: int = 4096
    max_total: int = 50_000
    min_retry_after_ms: int = 100
    max_retry_after_ms: int = 60_000

    def __post_init__(self) -> None:
        names = [c.name for c in self.classes]
        if not names or len(set(names)) != len(names):
            raise ValueError("SLO class names must be non-empty and unique")
        if self.default_class not in names:
            raise ValueError(f"default_class {self.default_class!r} is not a class")
        if self.quantum <= 0:
            raise ValueError("quantum must be positive")
        for t, w in self.tenant_weights.items():
            if w <= 0:
                raise ValueError(f"tenant weight of {t!r} must be > 0")


@dataclass(frozen=True, slots=True)
class QueuedRequest:
    """What the queue needs to know. ``deadline`` is absolute (same clock as ``now``)."""

    request_id: str
    tenant: str = ""
    slo_class: str = ""
    cost: int = 1
    deadline: float | None = None


@dataclass(frozen=True, slots=True)
class Admitted:
    request_id: str
    slo_class: str
    depth: int  # requests queued in the class after this offer


@dataclass(frozen=True, slots=True)
class Shed:
    request_id: str
    reason: str
    retry_after_ms: int


@dataclass(slots=True)
class _Entry:
    req: QueuedRequest
    arrival: float
    seq: int
    cls: str


class _Tenant:
    __slots__ = ("deficit", "heap")

    def __init__(self) -> None:
        self.deficit = 0.0
        # (has_no_deadline, deadline, seq, entry): EDF first, then FIFO.
        self.heap: list[tuple[bool, float, int, _Entry]] = []


class _Class:
    def __init__(self, spec: ClassSpec) -> None:
        self.spec = spec
        self.tenants: dict[str, _Tenant] = {}
        self.active: deque[str] = deque()
        self.size = 0
        # (arrival, seq, entry), oldest first, when the class promotes starved requests;
        # entries that left the queue are dropped lazily (see AdmissionQueue._live).
        self.by_age: list[tuple[float, int, _Entry]] = []


class AdmissionQueue:
    """Bounded, classed, fair admission queue. Not thread-safe; deterministic."""

    def __init__(self, config: QueueConfig | None = None) -> None:
        self.config = config or QueueConfig()
        self._classes = {c.name: _Class(c) for c in self.config.classes}
        self._order = sorted(self._classes.values(), key=lambda c: -c.spec.priority)
        self._entries: dict[str, _Entry] = {}
        # (time it expires, seq, entry), soonest first; left entries dropped lazily. With
        # the classes' age heaps, expiry and starvation cost O(log n) per request instead of
        # a scan of the whole queue on every pump (which made an overloaded gateway slower
        # the longer its queue grew).
        self._by_expiry: list[tuple[float, int, _Entry]] = []
        self._seq = itertools.count()
        self._rate = 0.0  # EWMA of released requests per second
        self._last_release: float | None = None

    # ------------------------------------------------------------------ queries
    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._entries

    def depth(self, slo_class: str) -> int:
        return self._classes[slo_class].size

    def class_of(self, slo_class: str) -> ClassSpec:
        """The spec of ``slo_class`` ("" = default). KeyError for an unknown class."""
        return self._classes[slo_class or self.config.default_class].spec

    def waiting_priorities(self) -> list[int]:
        return [c.spec.priority for c in self._order if c.size]

    # ------------------------------------------------------------------ offer
    def offer(self, req: QueuedRequest, now: float) -> Admitted | Shed:
        """Queue ``req`` or refuse it (class or total bound reached, already expired).

        KeyError for an unknown class (the shell validates classes first: 400);
        ValueError for a duplicate request id."""
        cname = req.slo_class or self.config.default_class
        cls = self._classes[cname]
        if req.request_id in self._entries:
            raise ValueError(f"request {req.request_id!r} is already queued")
        if req.deadline is not None and req.deadline <= now:
            return Shed(req.request_id, "deadline already passed", 0)
        if cls.size >= cls.spec.max_queued or len(self._entries) >= self.config.max_total:
            return Shed(
                req.request_id, f"queue full for class {cname!r}", self.retry_after_ms(cname)
            )
        entry = _Entry(req, now, next(self._seq), cname)
        self._push(cls, entry)
        return Admitted(req.request_id, cname, cls.size)

    def requeue(self, req: QueuedRequest, arrival: float) -> None:
        """Put back a released request that has not sent its first byte (pre-empted or its
        upstream failed before streaming). Keeps its original ``arrival`` so it does not
        lose its place in line; never refused by the bounds (accepted work is not lost)."""
        cname = req.slo_class or self.config.default_class
        if req.request_id in self._entries:
            raise ValueError(f"request {req.request_id!r} is already queued")
        self._push(self._classes[cname], _Entry(req, arrival, -next(self._seq) - 1, cname))

    def _push(self, cls: _Class, e: _Entry) -> None:
        t = cls.tenants.get(e.req.tenant)
        if t is None:
            t = cls.tenants[e.req.tenant] = _Tenant()
        if not t.heap:
            cls.active.append(e.req.tenant)
        dl = e.req.deadline
        heapq.heappush(t.heap, (dl is None, dl if dl is not None else 0.0, e.seq, e))
        cls.size += 1
        self._entries[e.req.request_id] = e
        expires = e.arrival + cls.spec.max_queue_ms / 1000.0
        if dl is not None and dl < expires:
            expires = dl
        heapq.heappush(self._by_expiry, (expires, e.seq, e))
        if len(self._by_expiry) > 2 * len(self._entries) + 64:
            self._by_expiry = [x for x in self._by_expiry if self._live(x[2])]
            heapq.heapify(self._by_expiry)
        if cls.spec.starve_after_ms:
            heapq.heappush(cls.by_age, (e.arrival, e.seq, e))
            if len(cls.by_age) > 2 * cls.size + 64:
                cls.by_age = [x for x in cls.by_age if self._live(x[2])]
                heapq.heapify(cls.by_age)

    def _live(self, e: _Entry) -> bool:
        return self._entries.get(e.req.request_id) is e

    # ------------------------------------------------------------------ release
    def next(self, now: float, capacity: int) -> list[QueuedRequest]:
        """Release up to ``capacity`` requests in discipline order (see module doc)."""
        out: list[QueuedRequest] = []
        while len(out) < capacity and self._entries:
            e = self._starved(now) or self._drr_pop()
            if e is None:
                break
            self._remove(e)
            out.append(e.req)
        if out:
            self._note_release(now, len(out))
        return out

    def _starved(self, now: float) -> _Entry | None:
        """The oldest request (arrival, then seq) among the classes' starved ones."""
        best: _Entry | None = None
        for cls in self._order:
            lim = cls.spec.starve_after_ms
            if not lim or not cls.size:
                continue
            heap = cls.by_age
            while not self._live(heap[0][2]):
                heapq.heappop(heap)
            e = heap[0][2]
            if (now - e.arrival) * 1000.0 >= lim and (
                best is None or (e.arrival, e.seq) < (best.arrival, best.seq)
            ):
                best = e
        return best

    def _drr_pop(self) -> _Entry | None:
        for cls in self._order:
            if not cls.size:
                continue
            while True:
                name = cls.active[0]
                t = cls.tenants[name]
                head = t.heap[0][3]
                cost = max(1, head.req.cost)
                if t.deficit >= cost:
                    t.deficit -= cost
                    return head
                w = self.config.tenant_weights.get(name, self.config.default_tenant_weight)
                # Credit enough whole rounds at once (same outcome as visiting repeatedly).
                quantum = self.config.quantum * w
                rounds = max(1, int((cost - t.deficit + quantum - 1) // quantum))
                if len(cls.active) == 1:
                    t.deficit += rounds * quantum
                else:
                    t.deficit += quantum
                    cls.active.rotate(-1)
        return None

    def _remove(self, e: _Entry) -> None:
        cls = self._classes[e.cls]
        t = cls.tenants[e.req.tenant]
        if t.heap[0][3] is e:
            heapq.heappop(t.heap)
        else:
            t.heap = [x for x in t.heap if x[3] is not e]
            heapq.heapify(t.heap)
        cls.size -= 1
        del self._entries[e.req.request_id]
        if not t.heap:
            t.deficit = 0.0
            cls.active.remove(e.req.tenant)
            del cls.tenants[e.req.tenant]

    def _note_release(self, now: float, n: int) -> None:
        if self._last_release is not None and now > self._last_release:
            inst = n / (now - self._last_release)
            self._rate = 0.8 * self._rate + 0.2 * inst if self._rate else inst
        self._last_release = now

    def retry_after_ms(self, slo_class: str) -> int:
        """Hint for a shed request: time to drain this class and those above it at the
        recent release rate (clamped to the configured bounds)."""
        prio = self._classes[slo_class].spec.priority
        ahead = sum(c.size for c in self._order if c.spec.priority >= prio)
        est = 1000.0 * ahead / self._rate if self._rate > 0 else self.config.max_retry_after_ms
        return int(min(max(est, self.config.min_retry_after_ms), self.config.max_retry_after_ms))

    # ------------------------------------------------------------------ expiry
    def expire(self, now: float) -> list[QueuedRequest]:
        """Remove and return requests past their class's ``max_queue_ms`` or their deadline
        (the shell answers them with a timeout). Idempotent for a given ``now``."""
        heap = self._by_expiry
        dead: list[_Entry] = []
        kept: list[tuple[float, int, _Entry]] = []  # due by the float sum, not by the rule
        while heap and heap[0][0] <= now:
            item = heapq.heappop(heap)
            e = item[2]
            if not self._live(e):
                continue
            if (now - e.arrival) * 1000.0 > self._classes[e.cls].spec.max_queue_ms or (
                e.req.deadline is not None and e.req.deadline <= now
            ):
                dead.append(e)
            else:
                kept.append(item)
        for item in kept:
            heapq.heappush(heap, item)
        dead.sort(key=lambda e: (e.arrival, e.seq))
        for e in dead:
            self._remove(e)
        return [e.req for e in dead]

    def cancel(self, request_id: str) -> bool:
        """Remove a queued request (client went away). False if it is not queued."""
        e = self._entries.get(request_id)
        if e is None:
            return False
        self._remove(e)
        return True


@dataclass(frozen=True, slots=True)
class InFlight:
    """A released request as the shell tracks it, for pre-emption decisions."""

    request_id: str
    priority: int
    started_streaming: bool
    released_at: float


def choose_preemption(queue: AdmissionQueue, in_flight: Sequence[InFlight]) -> str | None:
    """Which in-flight request to pre-empt for the highest-priority waiting one, or None.

    Only requests that have not sent their first byte and whose class priority is strictly
    lower than the best waiting class qualify; among them the lowest priority, then the most
    recently released (least work lost)."""
    waiting = queue.waiting_priorities()
    if not waiting:
        return None
    top = max(waiting)
    cands = [f for f in in_flight if not f.started_streaming and f.priority < top]
    if not cands:
        return None
    return min(cands, key=lambda f: (f.priority, -f.released_at, f.request_id)).request_id


def saturated(
    loads: Iterable[tuple[float, int]], kv_threshold: float, waiting_threshold: int
) -> bool:
    """True when every endpoint is over a threshold, given (kv_usage, waiting) per eligible
    endpoint; an empty fleet is saturated."""
    for kv, waiting in loads:
        if kv < kv_threshold and waiting < waiting_threshold:
            return False
    return True
