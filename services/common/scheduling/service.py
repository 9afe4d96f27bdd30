"""The scheduler's service core (pure): fleet state + routing + admission in one object.

Used by both shells (the OpenAI HTTP gateway and the gRPC ``SchedulerService``) so that a
decision, its reservation and its release are the same code whichever way it is asked.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field

from services.common.admission import AdmissionQueue, saturated
from services.common.routing.framework import Scheduler
from services.common.routing.types import (
    Decision,
    EndpointSnapshot,
    NoEndpoint,
    Pick,
    RequestView,
)
from services.common.scheduling.availability import no_engine
from services.common.scheduling.fleet import Fleet


@dataclass(frozen=True, slots=True)
class SLOTargets:
    """TTFT (used as the request's TTFT budget) and TPOT targets per class (ms, 0 = none).
    Built from settings by ``services.scheduler.slo.slo_targets``."""

    ttft_ms: Mapping[str, float] = field(
        default_factory=lambda: {"interactive": 2_000.0, "agent": 10_000.0, "batch": 0.0}
    )
    tpot_ms: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class CoreLimits:
    # Dispatch no more than this many of our requests per eligible endpoint at once.
    max_in_flight_per_endpoint: int = 256
    # The fleet is saturated when every eligible endpoint is at/over one of these.
    saturation_kv_usage: float = 0.95
    saturation_waiting: int = 64
    # Release a pick reservation nobody reported after this long.
    reservation_ttl_s: float = 600.0


class GatewayCore:
    def __init__(
        self,
        scheduler: Scheduler,
        fleet: Fleet,
        queue: AdmissionQueue,
        *,
        limits: CoreLimits | None = None,
        slo: SLOTargets | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.fleet = fleet
        self.queue = queue
        self.limits = limits or CoreLimits()
        self.slo = slo or SLOTargets()
        # Called after every Pick with (request, pick, now); must not raise or block
        # (e.g. the active-active shell queues the routed prefix for other replicas).
        self.pick_listeners: list[Callable[[RequestView, Pick, float], None]] = []
        # Called once per pick when it settles with (request, pick, ok); same rules.
        self.settle_listeners: list[Callable[[RequestView, Pick, bool], None]] = []
        # Picks not settled yet (see settle semantics on first_token/abandon/release).
        self._unsettled: dict[str, tuple[RequestView, Pick]] = {}
        self._capacity: tuple[EndpointSnapshot, int] | None = None

    def ttft_budget_ms(self, slo_class: str, deadline_in_ms: float | None = None) -> float:
        """The tighter of the class target and an explicit deadline (0 = none)."""
        cls = slo_class or self.queue.config.default_class
        target = self.slo.ttft_ms.get(cls, 0.0)
        if deadline_in_ms is not None and deadline_in_ms > 0:
            return min(target, deadline_in_ms) if target > 0 else deadline_in_ms
        return target

    def tpot_target_ms(self, slo_class: str) -> float:
        """The class's TPOT target (0 = none)."""
        return self.slo.tpot_ms.get(slo_class or self.queue.config.default_class, 0.0)

    def saturated(self, now: float) -> bool:
        """Every eligible decode/worker endpoint is over a saturation threshold (or there is
        none): freeing one of our in-flight slots would not let a request in."""
        snap = self.fleet.snapshot(now)
        lim = self.limits
        return saturated(
            ((e.kv_usage, e.waiting) for e in snap.pools()[1]),
            lim.saturation_kv_usage,
            lim.saturation_waiting,
        )

    def unavailable(self, now: float, exclude: Collection[str] = ()) -> str | None:
        """Why no engine can serve a request (excluding ``exclude``) now, or None when one
        can (:func:`~services.common.scheduling.availability.no_engine` over the snapshot the
        queue's capacity is counted on)."""
        return no_engine(
            self.fleet.snapshot(now),
            decode_can_prefill=self.scheduler.decode_can_prefill,
            exclude=exclude,
        )

    def capacity(self, now: float) -> int:
        """How many queued requests may be dispatched now: the free in-flight slots of the
        eligible decode/worker endpoints that are not saturated (0 when all are).
        Memoized per fleet snapshot (any reservation change makes a new snapshot)."""
        snap = self.fleet.snapshot(now)
        hit = self._capacity
        if hit is not None and hit[0] is snap:
            return hit[1]
        lim = self.limits
        kv_max, wait_max, cap = lim.saturation_kv_usage, lim.saturation_waiting, 0
        per = lim.max_in_flight_per_endpoint
        in_flight = self.fleet.in_flight
        for e in snap.pools()[1]:
            if e.kv_usage < kv_max and e.waiting < wait_max:
                cap += max(0, per - in_flight(e.instance_id))
        self._capacity = (snap, cap)
        return cap

    def pick(
        self, view: RequestView, now: float, pick_id: str, profile: str = "", deployment: str = ""
    ) -> Decision:
        """Run a scheduling cycle and, on :class:`Pick`, reserve load under ``pick_id``
        until :meth:`release`. KeyError for an unknown profile."""
        snap = self.fleet.snapshot(now, deployment)
        if not len(snap):
            return NoEndpoint(no_engine(snap) or "no engine is serving")
        d = self.scheduler.schedule(view, snap, now, profile)
        if isinstance(d, Pick):
            uncached = max(0, view.prompt_tokens - d.predicted_cached_tokens)
            target = d.prefill.endpoint if d.prefill else d.decode.endpoint
            ids = [d.decode.endpoint.instance_id]
            if d.prefill:
                ids.append(d.prefill.endpoint.instance_id)
            self.fleet.reserve(pick_id, ids, {target.instance_id: uncached}, now)
            self._unsettled[pick_id] = (view, d)
            for listener in self.pick_listeners:
                listener(view, d, now)
        return d

    def first_token(self, pick_id: str) -> None:
        """The picked instance answered: its pending prefill is done, the pick is settled
        as ok for the routing plugins."""
        self.fleet.first_token(pick_id)
        self._settle(pick_id, True)

    def abandon(self, pick_id: str) -> bool:
        """The pick failed before any byte (upstream error, pre-empted): routing plugins
        undo what they recorded for it (e.g. routed-prefix entries). Call before
        :meth:`release`; False if the pick is unknown or already settled."""
        return self._settle(pick_id, False)

    def _settle(self, pick_id: str, ok: bool) -> bool:
        rec = self._unsettled.pop(pick_id, None)
        if rec is None:
            return False
        self.scheduler.settle(rec[0], rec[1], ok)
        for listener in self.settle_listeners:
            listener(rec[0], rec[1], ok)
        return True

    def release(self, pick_id: str) -> bool:
        """Idempotent: False if the pick is unknown or already released. A pick neither
        answered nor abandoned is settled as ok (its outcome was reported by the caller)."""
        self._settle(pick_id, True)
        return self.fleet.release(pick_id)

    def end_session(self, session_id: str) -> int:
        """A session's final turn was answered: routing plugins drop its per-session state
        (:meth:`~services.common.routing.framework.Scheduler.end_session`)."""
        return self.scheduler.end_session(session_id) if session_id else 0

    def tick(self, now: float) -> list[str]:
        """Housekeeping: release reservations nobody reported. Returns their pick ids."""
        old = self.fleet.expire_reservations(now, self.limits.reservation_ttl_s)
        for pick_id in old:
            self._settle(pick_id, True)
        return old
