"""Prometheus metrics of the gateway, in a registry passed down from ``main`` (never the
process-global default registry), exposed at ``GET /metrics`` on the gateway's HTTP port and
on the service's ``metrics_port``.

Families (``slo_class`` is the resolved class, the default class when a request names none):

| name | type | labels |
|---|---|---|
| ``tideserve_gateway_requests_total`` | counter | route, outcome, status |
| ``tideserve_gateway_bad_requests_total`` | counter | reason, param (400/404/413, never forwarded) |
| ``tideserve_gateway_shed_total`` | counter | slo_class, where (admission, queue_timeout, routing) |
| ``tideserve_gateway_ttft_seconds`` | histogram | slo_class |
| ``tideserve_gateway_tpot_seconds`` | histogram | slo_class (streamed answers with usage) |
| ``tideserve_gateway_e2e_seconds`` | histogram | slo_class |
| ``tideserve_gateway_queue_seconds`` | histogram | slo_class (parsed → admitted) |
| ``tideserve_gateway_retries_total`` | counter | — (upstream retries before the first byte) |
| ``tideserve_gateway_upstream_errors_total`` | counter | instance, kind |
| ``tideserve_gateway_queue_depth`` | gauge | slo_class |
| ``tideserve_gateway_endpoint_in_flight`` | gauge | instance, role |
| ``tideserve_gateway_endpoint_healthy`` / ``_draining`` | gauge | instance |
| ``tideserve_gateway_endpoint_circuit`` | gauge | instance, state (1 = current state) |
| ``tideserve_gateway_endpoint_load_source`` | gauge | instance, source (stream, scrape, none) |
| ``tideserve_gateway_feed_total`` | counter | feed, event (load snapshots, membership) |

Gauges of the queue and the endpoints are read from the core at scrape time (nothing on the
request path). The kvmeta lookup, request-record and sharing counters are exported by
:mod:`services.scheduler.feeds.integrations` into the same registry.

The request-level figures come from the per-request
:class:`~services.scheduler.core.records.RequestContext` (:func:`observe` is pure), handed
to :meth:`GatewayMetrics.finished` when the request ends.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from tideserve.v1 import events_pb2

from services.common.scheduling.service import GatewayCore
from services.scheduler.core.records import RequestContext, outcome_for
from services.scheduler.http.records import Ending, Finished

__all__ = [
    "GatewayMetrics",
    "Observation",
    "observe",
    "outcome_name",
    "upstream_kind",
]

_TTFT = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
_TPOT = (0.002, 0.005, 0.01, 0.02, 0.04, 0.06, 0.1, 0.2, 0.5, 1.0)
_E2E = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
_QUEUE = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_CIRCUIT = ("closed", "open", "half-open")


# --------------------------------------------------------------------------- pure parts


@dataclass(frozen=True, slots=True)
class Observation:
    """What one finished request contributes (seconds; None = not measured)."""

    outcome: str
    slo_class: str
    queue_s: float | None
    ttft_s: float | None
    tpot_s: float | None
    e2e_s: float


_OUTCOME_NAMES = {
    value: name.removeprefix("REQUEST_OUTCOME_").lower()
    for name, value in events_pb2.RequestOutcome.items()
}


def outcome_name(outcome: events_pb2.RequestOutcome) -> str:
    """``REQUEST_OUTCOME_UPSTREAM_ERROR`` → ``upstream_error``."""
    return _OUTCOME_NAMES[outcome]


def observe(t: RequestContext, *, status: int, finish: float, default_class: str) -> Observation:
    """The metrics of a finished request from its trace (pure). TTFT only when a first byte
    reached the client with a 200; TPOT only for streamed answers whose usage says more
    than one completion token; queue time only when the request was admitted."""
    ok_bytes = t.first_byte is not None and status == 200
    ttft = t.first_byte - t.arrival if ok_bytes and t.first_byte is not None else None
    tpot = None
    if ok_bytes and t.streamed and t.first_byte is not None:
        usage = t.answer().usage
        if usage is not None and usage.completion_tokens > 1:
            tpot = max(0.0, finish - t.first_byte) / (usage.completion_tokens - 1)
    queue = None
    if t.parsed_at is not None and t.admitted_at is not None:
        queue = max(0.0, t.admitted_at - t.parsed_at)
    cls = (t.parsed.slo_class if t.parsed is not None else "") or default_class
    return Observation(
        outcome=outcome_name(outcome_for(status, t.error, t.cancelled)),
        slo_class=cls,
        queue_s=queue,
        ttft_s=max(0.0, ttft) if ttft is not None else None,
        tpot_s=tpot,
        e2e_s=max(0.0, finish - t.arrival),
    )


def upstream_kind(reason: str) -> str:
    """A bounded label for an :class:`~upstream.UpstreamFailure` reason."""
    r = reason.lower()
    for prefix, kind in (
        ("connect", "connect"),
        ("http 5", "http_5xx"),
        ("prefill read", "prefill_read"),
        ("read", "read"),
        ("stream broken", "stream_broken"),
        ("stream", "stream"),
        ("empty stream", "empty_stream"),
    ):
        if r.startswith(prefix):
            return kind
    return "other"


# --------------------------------------------------------------------------- shell

StatsSource = Callable[[], Mapping[str, int]]


class GatewayMetrics:
    """The gateway's metric families in ``registry`` (one instance per registry: a registry
    refuses the same family twice). :meth:`attach` adds the scrape-time collector of a
    core's queue and endpoints."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "tideserve_gateway_requests",
            "Gateway requests by route, outcome and HTTP status",
            ["route", "outcome", "status"],
            registry=r,
        )
        self.bad_requests = Counter(
            "tideserve_gateway_bad_requests",
            "Requests refused before routing (400/404/413), by reason and field",
            ["reason", "param"],
            registry=r,
        )
        self.shed = Counter(
            "tideserve_gateway_shed",
            "Requests answered 429 (overload), by class and where they were shed",
            ["slo_class", "where"],
            registry=r,
        )
        self.ttft = Histogram(
            "tideserve_gateway_ttft_seconds",
            "Arrival to first byte to the client",
            ["slo_class"],
            buckets=_TTFT,
            registry=r,
        )
        self.tpot = Histogram(
            "tideserve_gateway_tpot_seconds",
            "Mean time per output token after the first (streamed answers)",
            ["slo_class"],
            buckets=_TPOT,
            registry=r,
        )
        self.e2e = Histogram(
            "tideserve_gateway_e2e_seconds",
            "Arrival to the end of the answer",
            ["slo_class"],
            buckets=_E2E,
            registry=r,
        )
        self.queue = Histogram(
            "tideserve_gateway_queue_seconds",
            "Time in admission (parsed to admitted)",
            ["slo_class"],
            buckets=_QUEUE,
            registry=r,
        )
        self.retries = Counter(
            "tideserve_gateway_retries", "Upstream retries before the first byte", registry=r
        )
        self.upstream_errors = Counter(
            "tideserve_gateway_upstream_errors",
            "Upstream failures by instance and kind",
            ["instance", "kind"],
            registry=r,
        )
        self.preemptions = Counter(
            "tideserve_gateway_preemptions",
            "Dispatches pre-empted before their first byte (requeued for a higher class)",
            registry=r,
        )
        self._collector: _Collector | None = None
        # Labelled children of the per-request families, looked up once per label set
        # (``labels()`` validates and locks on every call).
        self._children: dict[tuple[Any, ...], Any] = {}

    def _child(self, family: Any, *values: str) -> Any:
        key = (family, *values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = family.labels(*values)
        return child

    # -- request path (one-liners for the gateway) ----------------------------------------
    def request_done(self, route: str, status: int, o: Observation) -> None:
        self._child(self.requests, route, o.outcome, str(status)).inc()
        c = o.slo_class
        self._child(self.e2e, c).observe(o.e2e_s)
        if o.ttft_s is not None:
            self._child(self.ttft, c).observe(o.ttft_s)
        if o.tpot_s is not None:
            self._child(self.tpot, c).observe(o.tpot_s)
        if o.queue_s is not None:
            self._child(self.queue, c).observe(o.queue_s)

    def bad_request(self, reason: str | None, param: str | None) -> None:
        self.bad_requests.labels(reason or "invalid", param or "").inc()

    def shed_request(self, slo_class: str, where: str) -> None:
        self.shed.labels(slo_class, where).inc()

    def upstream_failed(self, instance_id: str, reason: str, retried: bool) -> None:
        self.upstream_errors.labels(instance_id, upstream_kind(reason)).inc()
        if retried:
            self.retries.inc()

    def preempted(self, n: int) -> None:
        if n:
            self.preemptions.inc(n)

    def value(self, name: str, labels: Mapping[str, str] | None = None) -> float:
        """A sample's current value (0.0 when absent); for tests and tools."""
        v = self.registry.get_sample_value(name, dict(labels or {}))
        return float(v) if v is not None else 0.0

    # -- scrape-time state ----------------------------------------------------------------
    def attach(self, core: GatewayCore, clock: Callable[[], float] = time.monotonic) -> None:
        """Export ``core``'s queue depth and endpoint state at scrape time (idempotent)."""
        if self._collector is None:
            self._collector = _Collector(core, clock)
            self.registry.register(self._collector)

    def add_feed(self, feed: str, stats: StatsSource) -> None:
        """Export a counter dict (e.g. a stream consumer's ``stats``) as
        ``tideserve_gateway_feed_total{feed, event}``. Needs :meth:`attach` first."""
        if self._collector is None:
            raise RuntimeError("attach() a core before adding feeds")
        self._collector.feeds[feed] = stats

    # -- finished requests --------------------------------------------------------------
    def finished(self, default_class: Callable[[], str]) -> Finished:
        """The listener observing every finished request (a cancelled handler counts
        with status 499)."""

        def done(ctx: RequestContext, end: Ending) -> None:
            status = 499 if end.aborted else end.status
            o = observe(ctx, status=status, finish=end.finish, default_class=default_class())
            self.request_done(ctx.path, status, o)

        return done


class _Collector(Collector):
    def __init__(self, core: GatewayCore, clock: Callable[[], float]) -> None:
        self.core = core
        self.clock = clock
        self.feeds: dict[str, StatsSource] = {}

    def collect(self) -> list[Metric]:
        core, now = self.core, self.clock()
        depth = GaugeMetricFamily(
            "tideserve_gateway_queue_depth", "Requests in the admission queue", labels=["slo_class"]
        )
        for c in core.queue.config.classes:
            depth.add_metric([c.name], float(core.queue.depth(c.name)))
        fam = {
            "in_flight": GaugeMetricFamily(
                "tideserve_gateway_endpoint_in_flight",
                "This gateway's requests in flight per endpoint",
                labels=["instance", "role"],
            ),
            "healthy": GaugeMetricFamily(
                "tideserve_gateway_endpoint_healthy",
                "1 when active health checks pass",
                labels=["instance"],
            ),
            "draining": GaugeMetricFamily(
                "tideserve_gateway_endpoint_draining",
                "1 while the endpoint gets no new requests",
                labels=["instance"],
            ),
            "circuit": GaugeMetricFamily(
                "tideserve_gateway_endpoint_circuit",
                "Circuit breaker state (1 = current)",
                labels=["instance", "state"],
            ),
            "source": GaugeMetricFamily(
                "tideserve_gateway_endpoint_load_source",
                "Where the endpoint's load figures come from (1 = current)",
                labels=["instance", "source"],
            ),
        }
        fleet = core.fleet
        for e in fleet.snapshot(now):
            i = e.instance_id
            fam["in_flight"].add_metric([i, e.role], float(fleet.in_flight(i)))
            fam["healthy"].add_metric([i], 1.0 if e.healthy else 0.0)
            fam["draining"].add_metric([i], 1.0 if e.draining else 0.0)
            for st in _CIRCUIT:
                fam["circuit"].add_metric([i, st], 1.0 if e.circuit == st else 0.0)
            src = fleet.load_source(i, now)
            for s in ("stream", "scrape", "none"):
                fam["source"].add_metric([i, s], 1.0 if src == s else 0.0)
        out: list[Metric] = [depth, *fam.values()]
        if self.feeds:
            feeds = CounterMetricFamily(
                "tideserve_gateway_feed",
                "Load-snapshot and membership stream events by outcome",
                labels=["feed", "event"],
            )
            for name, stats in sorted(self.feeds.items()):
                for event, n in sorted(stats().items()):
                    feeds.add_metric([name, event], float(n))
            out.append(feeds)
        return out
