"""The gateway's live view of its endpoints (pure: no I/O, time is a parameter).

Holds membership (static list or membership events), the last load report per endpoint,
active-health results, drain flags, a circuit breaker per endpoint (passive failure
detection) and this gateway's own in-flight requests, and turns them into the immutable
:class:`EndpointSnapshot` a scheduling cycle runs on.

Load: engine load snapshots (stream) win over ``/metrics`` scrapes while fresh; see
:mod:`services.common.scheduling.load_merge`. Membership: :meth:`Fleet.retire` removes an
endpoint at once when this gateway has nothing in flight on it, else drains it and removes
it when its last request is released (in-flight requests finish).

Reservations: a pick reserves one request (and, until its first token, its uncached prompt
tokens as pending prefill) on each chosen endpoint. Engines report load with a lag, so the
snapshot counts ``max(reported, ours)``: ``reserved_* = max(0, ours - reported)``. A scrape
reports no prefill queue; with ``scrape_queue_estimate`` the view adds, on top of the
reservations, the waiting requests that this gateway's unanswered picks (and the peers'
heartbeats) do not account for (:func:`~.load_merge.foreign_prefill`, at the moving mean of
this gateway's picks' prefill tokens when the scrape arrived).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from services.common.routing.types import Circuit, EndpointSnapshot, EndpointView, Role
from services.common.scheduling.load_merge import (
    Gone,
    LoadReport,
    Sample,
    Source,
    discount,
    foreign_prefill,
    merge_load,
    newer,
)
from services.common.scheduling.load_merge import needs_scrape as _needs_scrape

__all__ = ["CircuitBreaker", "EndpointSpec", "Fleet", "LoadReport"]

# Weight of each pick in the moving mean of picks' prefill tokens.
PREFILL_MEAN_WEIGHT = 1.0 / 64


@dataclass(frozen=True, slots=True)
class EndpointSpec:
    instance_id: str
    url: str
    role: Role = "worker"
    bootstrap_host: str = ""
    bootstrap_port: int = 0
    deployment: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)


class CircuitBreaker:
    """closed → open after ``failures`` consecutive failures; open → half-open after
    ``open_s``; half-open → closed on a success, back to open on a failure."""

    def __init__(self, failures: int = 3, open_s: float = 5.0) -> None:
        self.threshold = failures
        self.open_s = open_s
        self.consecutive = 0
        self.opened_at: float | None = None

    def state(self, now: float) -> Circuit:
        if self.opened_at is None:
            return "closed"
        return "half-open" if now - self.opened_at >= self.open_s else "open"

    def success(self, now: float) -> None:
        self.consecutive = 0
        self.opened_at = None

    def failure(self, now: float) -> None:
        self.consecutive += 1
        st = self.state(now)
        if st == "half-open" or (st == "closed" and self.consecutive >= self.threshold):
            self.opened_at = now


@dataclass(slots=True)
class _Live:
    spec: EndpointSpec
    breaker: CircuitBreaker
    scraped: Sample | None = None
    streamed: Sample | None = None
    stream_seq: tuple[int, int] | None = None
    healthy: bool = True
    probe_failures: int = 0
    draining: bool = False
    retiring: bool = False
    ours: int = 0
    ours_pending_tokens: int = 0
    # this gateway's picks that prefill here and have not answered (now; at the last scrape)
    unanswered: int = 0
    scrape_unanswered: int = 0
    scrape_prefill_mean: float = 0.0  # the fleet's prefill_mean at the last scrape
    # What this gateway saw end since the last stream snapshot (see load_merge.Gone).
    stream_gone: Gone = field(default_factory=Gone)

    def ended(self, dispatched_at: float, requests: int, prefill_tokens: int) -> None:
        """Work dispatched at ``dispatched_at`` ended: count it against the stream snapshot
        if that arrived after the dispatch (only then can it hold it)."""
        s = self.streamed
        if s is not None and dispatched_at <= s.at:
            self.stream_gone.requests += requests
            self.stream_gone.prefill_tokens += prefill_tokens


@dataclass(slots=True)
class _Reservation:
    instances: tuple[str, ...]
    pending_tokens: dict[str, int]
    at: float
    prefilling: tuple[str, ...] = ()  # where it prefills, until its first token


class Fleet:
    """Mutable endpoint state; every method is O(1) or O(endpoints) and never raises for
    unknown ids except where documented (``KeyError``)."""

    def __init__(
        self,
        *,
        unhealthy_after: int = 2,
        breaker_failures: int = 3,
        breaker_open_s: float = 5.0,
        load_stale_s: float = 10.0,
        stream_stale_s: float = 2.0,
        scrape_queue_estimate: bool = False,
    ) -> None:
        """``scrape_queue_estimate``: a scraped view's pending prefill also counts the
        waiting requests this gateway did not send (module docstring); off, it is only this
        gateway's own reservations (and the peers')."""
        self.unhealthy_after = unhealthy_after
        self.breaker_failures = breaker_failures
        self.breaker_open_s = breaker_open_s
        self.load_stale_s = load_stale_s
        self.stream_stale_s = stream_stale_s
        self.scrape_queue_estimate = scrape_queue_estimate
        # moving mean of the prefill tokens of this gateway's picks (scrape queue estimate)
        self.prefill_mean = 0.0
        self._eps: dict[str, _Live] = {}
        self._res: dict[str, _Reservation] = {}
        self._version = 0
        # Other gateway replicas' in-flight (requests, pending tokens) per instance.
        self._remote: Mapping[str, tuple[int, int]] = {}
        # Built views per instance: (view, built_at, valid_until). Dropped on any change
        # to the instance; time-dependent fields (stale load, open circuit) bound validity.
        self._views: dict[str, tuple[EndpointView, float, float]] = {}
        # Built snapshots per deployment filter: (snapshot, built_at, valid_until). Any
        # view change drops them all; membership changes also drop the id order.
        self._snaps: dict[str, tuple[EndpointSnapshot, float, float]] = {}
        # Per snapshot key: instances whose view changed since it was built.
        self._snap_dirty: dict[str, set[str]] = {}
        self._order: list[str] | None = None
        self._deployments: frozenset[str] | None = None

    # -- membership -----------------------------------------------------------------------
    def upsert(self, spec: EndpointSpec, healthy: bool = True) -> None:
        """Add an endpoint or update its address/role (keeps its load and reservations;
        an endpoint being retired is kept, and stays draining until undrained)."""
        live = self._eps.get(spec.instance_id)
        if live is None:
            self._eps[spec.instance_id] = _Live(
                spec, CircuitBreaker(self.breaker_failures, self.breaker_open_s), healthy=healthy
            )
        else:
            live.spec = spec
            live.retiring = False
        self._dirty(spec.instance_id)
        self._version += 1
        self._order = self._deployments = None

    def remove(self, instance_id: str) -> bool:
        """Forget an endpoint now (prefer :meth:`retire` while requests may be in flight)."""
        self._version += 1
        self._dirty(instance_id)
        self._order = self._deployments = None
        return self._eps.pop(instance_id, None) is not None

    def retire(self, instance_id: str) -> bool:
        """Drain semantics for a removed instance: no new requests; it is forgotten once
        this gateway's in-flight requests on it are released. True when it was removed
        now, False when it waits for in-flight requests (or is unknown). Idempotent."""
        live = self._eps.get(instance_id)
        if live is None:
            return False
        if live.ours <= 0:
            return self.remove(instance_id)
        live.draining = live.retiring = True
        self._dirty(instance_id)
        return False

    def retiring(self, instance_id: str) -> bool:
        live = self._eps.get(instance_id)
        return live is not None and live.retiring

    def resolve(self, instance_id: str, url: str = "") -> str | None:
        """The known instance an outside report names: by id, else by base URL (engines and
        the autoscaler may name an instance differently from the static list). None if
        neither matches."""
        if instance_id in self._eps:
            return instance_id
        u = url.rstrip("/")
        if u:
            for iid, live in self._eps.items():
                if live.spec.url == u:
                    return iid
        return None

    def __contains__(self, instance_id: object) -> bool:
        return instance_id in self._eps

    def ids(self) -> list[str]:
        """Known instance ids, sorted (a new list each call)."""
        order = self._order
        if order is None:
            order = self._order = sorted(self._eps)
        return list(order)

    def spec(self, instance_id: str) -> EndpointSpec:
        """KeyError for an unknown instance."""
        return self._eps[instance_id].spec

    # -- observations ---------------------------------------------------------------------
    def report_load(
        self,
        instance_id: str,
        load: LoadReport,
        now: float,
        *,
        source: Literal["scrape", "stream"] = "scrape",
        seq: tuple[int, int] | None = None,
    ) -> bool:
        """Record a load report. ``stream`` reports carry ``seq = (epoch, ts_ms)``; an
        older or repeated one is ignored. Returns False when ignored or unknown."""
        live = self._eps.get(instance_id)
        if live is None:
            return False
        if source == "stream":
            if seq is not None:
                if not newer(live.stream_seq, *seq):
                    return False
                live.stream_seq = seq
            live.streamed = Sample(load, now)
            live.stream_gone = Gone()
        else:
            live.scraped = Sample(load, now)
            live.scrape_unanswered = live.unanswered
            live.scrape_prefill_mean = self.prefill_mean
        self._dirty(instance_id)
        return True

    def needs_scrape(self, instance_id: str, now: float) -> bool:
        """True when the endpoint has no fresh load snapshot from the stream."""
        live = self._eps.get(instance_id)
        return live is not None and _needs_scrape(live.streamed, now, self.stream_stale_s)

    def load_source(self, instance_id: str, now: float) -> Source:
        live = self._eps.get(instance_id)
        if live is None:
            return "none"
        return self._merged(live, now)[1]

    def _merged(self, live: _Live, now: float) -> tuple[LoadReport, Source, float]:
        load, source, until = merge_load(
            live.streamed,
            live.scraped,
            now,
            stream_stale_s=self.stream_stale_s,
            scrape_stale_s=self.load_stale_s,
        )
        if source != "stream":
            return load, source, until
        return discount(load, live.stream_gone), source, until

    def probe(self, instance_id: str, ok: bool, now: float) -> None:
        """Active health check result: unhealthy after ``unhealthy_after`` failures in a
        row, healthy again after one success."""
        live = self._eps.get(instance_id)
        if live is None:
            return
        was = live.healthy
        if ok:
            live.probe_failures = 0
            live.healthy = True
        else:
            live.probe_failures += 1
            if live.probe_failures >= self.unhealthy_after:
                live.healthy = False
        if live.healthy != was:  # the view shows health, not the failure count
            self._dirty(instance_id)

    def upstream_result(self, instance_id: str, ok: bool, now: float) -> None:
        """Passive detection: a forwarded request's outcome feeds the circuit breaker."""
        live = self._eps.get(instance_id)
        if live is None:
            return
        opened = live.breaker.opened_at
        if ok:
            live.breaker.success(now)
        else:
            live.breaker.failure(now)
        if live.breaker.opened_at != opened:  # the view shows the circuit state only
            self._dirty(instance_id)

    def set_draining(self, instance_id: str, draining: bool) -> int:
        """Drain/undrain (idempotent); returns this gateway's in-flight count on it.
        KeyError for an unknown instance."""
        live = self._eps[instance_id]
        live.draining = draining
        self._dirty(instance_id)
        return live.ours

    # -- reservations ---------------------------------------------------------------------
    def reserve(
        self, pick_id: str, instances: Iterable[str], pending: Mapping[str, int], now: float
    ) -> None:
        """Count a dispatched request on ``instances``; ``pending`` prefill tokens per
        instance until :meth:`first_token`. Re-reserving a pick_id replaces it."""
        self.release(pick_id)
        inst = tuple(dict.fromkeys(i for i in instances if i in self._eps))
        toks = {i: int(pending.get(i, 0)) for i in inst}
        prefilling = tuple(i for i in inst if i in pending)
        for i in inst:
            self._eps[i].ours += 1
            self._eps[i].ours_pending_tokens += toks[i]
            self._dirty(i)
        for i in prefilling:
            self._eps[i].unanswered += 1
            self.prefill_mean += PREFILL_MEAN_WEIGHT * (toks[i] - self.prefill_mean)
        self._res[pick_id] = _Reservation(inst, toks, now, prefilling)

    def _answered(self, r: _Reservation) -> None:
        for i in r.prefilling:
            live = self._eps.get(i)
            if live is not None:
                live.unanswered -= 1
        r.prefilling = ()

    def first_token(self, pick_id: str) -> None:
        r = self._res.get(pick_id)
        if r is None:
            return
        self._answered(r)
        for i, n in r.pending_tokens.items():
            live = self._eps.get(i)
            if n and live is not None:
                live.ours_pending_tokens -= n
                live.ended(r.at, 0, n)
                self._dirty(i)
        r.pending_tokens = {}

    def release(self, pick_id: str) -> bool:
        """Drop a reservation; False if unknown (already released: idempotent)."""
        r = self._res.pop(pick_id, None)
        if r is None:
            return False
        self._answered(r)
        for i in r.instances:
            self._dirty(i)
            live = self._eps.get(i)
            if live is not None:
                live.ours -= 1
                live.ours_pending_tokens -= r.pending_tokens.get(i, 0)
                live.ended(r.at, 1, r.pending_tokens.get(i, 0))
                if live.retiring and live.ours <= 0:
                    self.remove(i)
        return True

    def expire_reservations(self, now: float, max_age_s: float) -> list[str]:
        """Release reservations older than ``max_age_s`` (a caller never reported)."""
        old = [p for p, r in self._res.items() if now - r.at > max_age_s]
        for p in old:
            self.release(p)
        return old

    def in_flight(self, instance_id: str) -> int:
        live = self._eps.get(instance_id)
        return live.ours if live else 0

    def own_in_flight(self) -> dict[str, tuple[int, int]]:
        """This gateway's (requests, pending prefill tokens) per instance."""
        return {i: (v.ours, v.ours_pending_tokens) for i, v in self._eps.items()}

    def set_remote_in_flight(self, counts: Mapping[str, tuple[int, int]]) -> None:
        """Replace the other gateway replicas' in-flight counts (active-active); the
        snapshot adds them to this gateway's own reservations."""
        self._remote = dict(counts)
        self._views.clear()
        self._snaps.clear()

    # -- snapshot -------------------------------------------------------------------------
    def _dirty(self, instance_id: str) -> None:
        """The instance's view must be rebuilt (snapshots holding it are patched)."""
        self._views.pop(instance_id, None)
        for ids in self._snap_dirty.values():
            ids.add(instance_id)

    def view(self, instance_id: str, now: float) -> EndpointView:
        """KeyError for an unknown instance. Cached until the instance changes or a
        time-dependent field (stale load, circuit leaving open) would change."""
        return self._entry(instance_id, now)[0]

    def _entry(self, instance_id: str, now: float) -> tuple[EndpointView, float, float]:
        hit = self._views.get(instance_id)
        if hit is not None and hit[1] <= now < hit[2]:
            return hit
        v, until = self._build(instance_id, now)
        hit = self._views[instance_id] = (v, now, until)
        return hit

    def _build(self, instance_id: str, now: float) -> tuple[EndpointView, float]:
        live = self._eps[instance_id]
        ld, source, until = self._merged(live, now)  # unknown/stale: trust only our own counts
        opened = live.breaker.opened_at
        if opened is not None and now - opened < live.breaker.open_s:
            until = min(until, opened + live.breaker.open_s)
        s = live.spec
        r_req, r_tok = self._remote.get(instance_id, (0, 0))
        pending = ld.pending_prefill_tokens
        if source == "scrape" and self.scrape_queue_estimate:  # not ours nor the peers'
            foreign = foreign_prefill(
                ld, own_waiting=live.scrape_unanswered, tokens_per_request=live.scrape_prefill_mean
            )
            pending += max(0, foreign - r_tok)
        view = EndpointView(
            instance_id=s.instance_id,
            url=s.url,
            role=s.role,
            running=ld.running,
            waiting=ld.waiting,
            tokens_in_flight=ld.tokens_in_flight,
            pending_prefill_tokens=pending,
            kv_usage=ld.kv_usage,
            kv_capacity_tokens=ld.kv_capacity_tokens,
            prefill_tokens_per_s=ld.prefill_tokens_per_s,
            healthy=live.healthy,
            draining=live.draining,
            circuit=live.breaker.state(now),
            reserved_requests=max(0, live.ours + r_req - ld.running - ld.waiting),
            reserved_tokens=max(0, live.ours_pending_tokens + r_tok - ld.pending_prefill_tokens),
            bootstrap_host=s.bootstrap_host,
            bootstrap_port=s.bootstrap_port,
            labels=s.labels,
        )
        return view, until

    def snapshot(self, now: float, deployment: str = "") -> EndpointSnapshot:
        """The endpoints (of ``deployment`` and those without one; all when ""), id-ordered.
        The same object is returned until any endpoint changes or a time-dependent field
        would change (callers may memoize per snapshot object)."""
        if deployment:
            deps = self._deployments
            if deps is None:
                deps = self._deployments = frozenset(v.spec.deployment for v in self._eps.values())
            if deps <= {"", deployment}:
                deployment = ""  # every endpoint qualifies: share the unfiltered snapshot
        hit = self._snaps.get(deployment)
        if hit is not None and hit[1] <= now < hit[2] and hit[0].version == self._version:
            dirty = self._snap_dirty[deployment]
            if not dirty:
                return hit[0]
            # A few views changed (a reservation, a load report): patch the snapshot.
            eps = self._eps
            entries = [self._entry(i, now) for i in dirty if i in eps]
            dirty.clear()
            snap = hit[0].replaced([e[0] for e in entries], self._version)
            until = min([hit[2], *(e[2] for e in entries)])
            self._snaps[deployment] = (snap, now, until)
            return snap
        order = self._order
        if order is None:
            order = self._order = sorted(self._eps)
        if deployment:
            eps = self._eps
            order = [i for i in order if eps[i].spec.deployment in ("", deployment)]
        entries = [self._entry(i, now) for i in order]
        until = min((e[2] for e in entries), default=float("inf"))
        snap = EndpointSnapshot([e[0] for e in entries], version=self._version, presorted=True)
        self._snaps[deployment] = (snap, now, until)
        self._snap_dirty[deployment] = set()
        return snap
