"""Load sources (stream snapshot vs /metrics scrape), staleness, ordering; fleet retire."""

from __future__ import annotations

import math

import pytest

from services.common.scheduling.fleet import EndpointSpec, Fleet
from services.common.scheduling.load_merge import (
    Gone,
    LoadReport,
    Sample,
    discount,
    foreign_prefill,
    merge_load,
    needs_scrape,
    newer,
)

ST = LoadReport(running=5, waiting=1, tokens_in_flight=900, pending_prefill_tokens=300)
SC = LoadReport(running=2, waiting=7)


@pytest.mark.parametrize(
    ("stream_at", "scrape_at", "now", "source", "until"),
    [
        (None, None, 10.0, "none", math.inf),
        (9.0, None, 10.0, "stream", 11.0),
        (9.0, 9.9, 10.0, "stream", 11.0),
        (7.0, 9.5, 10.0, "scrape", 19.5),
        (7.0, None, 10.0, "none", math.inf),
        (None, 9.5, 10.0, "scrape", 19.5),
        (None, -0.5, 10.0, "none", math.inf),
        (8.0, None, 10.0, "stream", 10.0),
    ],
    ids=[
        "nothing",
        "fresh-stream",
        "stream-wins-over-newer-scrape",
        "stale-stream-falls-back",
        "stale-stream-no-scrape",
        "scrape-only",
        "stale-scrape",
        "stream-at-the-bound",
    ],
)
def test_merge_load(
    stream_at: float | None, scrape_at: float | None, now: float, source: str, until: float
) -> None:
    stream = Sample(ST, stream_at) if stream_at is not None else None
    scrape = Sample(SC, scrape_at) if scrape_at is not None else None
    load, src, valid = merge_load(stream, scrape, now, stream_stale_s=2.0, scrape_stale_s=10.0)
    assert (src, valid) == (source, until)
    assert load == {"stream": ST, "scrape": SC, "none": LoadReport()}[source]


@pytest.mark.parametrize(
    ("stream_at", "now", "expected"),
    [(None, 5.0, True), (4.0, 5.0, False), (2.5, 5.0, True), (3.0, 5.0, False)],
    ids=["no-snapshot", "fresh", "stale", "at-bound"],
)
def test_needs_scrape(stream_at: float | None, now: float, expected: bool) -> None:
    s = Sample(ST, stream_at) if stream_at is not None else None
    assert needs_scrape(s, now, 2.0) is expected


@pytest.mark.parametrize(
    ("last", "stamp", "expected"),
    [
        (None, (1, 100), True),
        ((1, 100), (1, 101), True),
        ((1, 100), (1, 100), False),
        ((1, 100), (1, 99), False),
        ((1, 100), (2, 5), True),
        ((2, 5), (1, 500), False),
    ],
    ids=["first", "later", "repeat", "older", "restarted-engine", "old-process"],
)
def test_newer(last: tuple[int, int] | None, stamp: tuple[int, int], expected: bool) -> None:
    assert newer(last, *stamp) is expected


def test_fleet_prefers_fresh_stream_then_scrape_and_skips_scrape_while_fresh() -> None:
    f = Fleet(stream_stale_s=2.0, load_stale_s=10.0)
    f.upsert(EndpointSpec("a", "http://a"))
    assert f.needs_scrape("a", 0.0) and f.load_source("a", 0.0) == "none"
    f.report_load("a", SC, 0.0)
    assert f.view("a", 0.5).waiting == 7 and f.load_source("a", 0.5) == "scrape"
    assert f.report_load("a", ST, 1.0, source="stream", seq=(1, 1000))
    v = f.view("a", 1.5)
    assert (v.running, v.tokens_in_flight, v.pending_prefill_tokens) == (5, 900, 300)
    assert not f.needs_scrape("a", 1.5)
    assert not f.report_load("a", SC, 1.6, source="stream", seq=(1, 999))  # older: ignored
    assert f.view("a", 1.7).running == 5
    # the stream goes quiet: scrape again, and the (cached) view falls back by time alone
    assert f.needs_scrape("a", 3.5) and f.view("a", 3.5).waiting == 7
    assert not f.report_load("zzz", ST, 1.0, source="stream")


def test_fleet_resolves_by_id_then_url() -> None:
    f = Fleet()
    f.upsert(EndpointSpec("127.0.0.1:30001", "http://127.0.0.1:30001"))
    assert f.resolve("127.0.0.1:30001") == "127.0.0.1:30001"
    assert f.resolve("engine-7", "http://127.0.0.1:30001/") == "127.0.0.1:30001"
    assert f.resolve("engine-8", "http://127.0.0.1:30002") is None
    assert f.resolve("engine-8") is None


def test_retire_waits_for_in_flight_requests() -> None:
    f = Fleet()
    f.upsert(EndpointSpec("a", "http://a"))
    f.upsert(EndpointSpec("b", "http://b"))
    f.reserve("p1", ["a"], {"a": 10}, 0.0)
    assert f.retire("a") is False and "a" in f and f.retiring("a")
    v = f.view("a", 0.0)
    assert v.draining and not v.eligible and f.in_flight("a") == 1
    assert f.retire("b") is True and "b" not in f  # nothing in flight: gone at once
    assert f.release("p1") and "a" not in f
    assert f.retire("a") is False  # unknown: idempotent


def test_readding_a_retiring_endpoint_keeps_its_counts() -> None:
    f = Fleet()
    f.upsert(EndpointSpec("a", "http://a"))
    f.reserve("p1", ["a"], {}, 0.0)
    f.retire("a")
    f.upsert(EndpointSpec("a", "http://a"))  # ADDED again while a request is in flight
    f.set_draining("a", False)
    assert not f.retiring("a") and f.in_flight("a") == 1
    f.release("p1")
    assert "a" in f and f.in_flight("a") == 0 and f.view("a", 0.0).eligible


@pytest.mark.parametrize(
    ("gone", "expected"),
    [
        (Gone(), ST),
        (
            Gone(2, 100),
            LoadReport(running=3, waiting=1, tokens_in_flight=800, pending_prefill_tokens=200),
        ),
        (
            Gone(6, 0),
            LoadReport(running=0, waiting=0, tokens_in_flight=900, pending_prefill_tokens=300),
        ),
        (Gone(9, 5000), LoadReport()),
    ],
    ids=["nothing-gone", "some-gone", "running-then-waiting", "never-below-zero"],
)
def test_discount(gone: Gone, expected: LoadReport) -> None:
    assert discount(ST, gone) == expected


@pytest.mark.parametrize("source", ["stream", "scrape"])
def test_fleet_takes_ended_work_off_the_stream_snapshot_that_held_it(source: str) -> None:
    """A request dispatched before a stream snapshot and seen to end after it comes off that
    snapshot; one dispatched after it (the snapshot cannot hold it) does not; a new snapshot
    starts afresh. Scrapes are used as reported."""
    f = Fleet()
    f.upsert(EndpointSpec("a", "http://a"))
    f.reserve("old", ["a"], {"a": 640}, 1.0)
    f.report_load("a", LoadReport(running=3, pending_prefill_tokens=1920), 1.5, source=source)  # type: ignore[arg-type]
    f.reserve("new", ["a"], {"a": 640}, 2.0)
    f.first_token("old")
    v = f.view("a", 2.1)
    stream = source == "stream"
    assert (v.running, v.pending_prefill_tokens) == (3, 1280 if stream else 1920)
    f.release("old")
    f.release("new")  # dispatched after the report: not in it
    v = f.view("a", 2.2)
    assert (v.running, v.pending_prefill_tokens) == ((2, 1280) if stream else (3, 1920))
    f.report_load("a", LoadReport(running=1), 2.5, source=source)  # type: ignore[arg-type]
    assert f.view("a", 2.6).running == 1


@pytest.mark.parametrize(
    ("load", "own_waiting", "per_request", "expected"),
    [
        (LoadReport(waiting=3), 0, 1000.0, 3000),
        (LoadReport(waiting=3), 2, 1000.0, 1000),
        (LoadReport(waiting=1), 4, 1000.0, 0),
        (LoadReport(waiting=2, pending_prefill_tokens=70), 0, 1000.0, 0),
        (LoadReport(waiting=3), 0, 0.0, 0),
        (LoadReport(running=4), 0, 1000.0, 0),
    ],
    ids=[
        "foreign-waiting-at-the-mean",
        "own-waiting-not-counted",
        "more-own-than-waiting",
        "a-reported-queue-is-used-instead",
        "no-mean-yet",
        "running-only",
    ],
)
def test_foreign_prefill(
    load: LoadReport, own_waiting: int, per_request: float, expected: int
) -> None:
    """A scrape's waiting requests beyond this gateway's own, at the mean prefill of its
    picks."""
    got = foreign_prefill(load, own_waiting=own_waiting, tokens_per_request=per_request)
    assert got == expected


def test_scrape_mode_prices_another_gateways_queue() -> None:
    """Scrape mode: an engine with requests waiting that this gateway did not send has a
    longer predicted TTFT than an idle one (the queue was invisible: the same TTFT on every
    instance without this gateway's own picks)."""
    from tests.unit._routing_helpers import ctx, make, req

    f = Fleet(scrape_queue_estimate=True)
    for i in ("a", "b", "c"):
        f.upsert(EndpointSpec(i, f"http://{i}"))
    f.reserve("own", ["c"], {"c": 4000}, 0.0)  # one own pick: the mean is 4000 / 64
    mean = f.prefill_mean
    f.report_load("a", LoadReport(running=1, waiting=2), 1.0)  # two not ours
    f.report_load("b", LoadReport(running=1), 1.0)
    f.report_load("c", LoadReport(waiting=1), 1.0)  # ours
    views = [f.view(i, 1.5) for i in ("a", "b", "c")]
    assert [v.pending_prefill for v in views] == [int(2 * mean), 0, 4000]
    assert [v.tokens_in_flight + v.reserved_tokens for v in views] == [0, 0, 4000]  # as before
    cost = make("ttft-cost", epsilon_ms=1e-6)
    c = ctx(now=1.5)
    cost.prepare(c, req(prompt_tokens=1000), views)
    # LinearModel: 10,000 tokens/s; own prefill 100 ms
    assert c.predicted_ttft_ms == pytest.approx({"a": 100.0 + 0.2 * mean, "b": 100.0, "c": 500.0})
    f.first_token("own")
    f.report_load("c", LoadReport(waiting=1), 2.0)  # no longer ours: someone else's
    assert f.view("c", 2.5).pending_prefill == int(mean)
    f.set_remote_in_flight({"a": (2, 100)})  # a peer's heartbeat accounts for some of a's
    assert f.view("a", 2.5).pending_prefill == max(int(2 * mean), 100)


@pytest.mark.parametrize(
    ("estimate", "expected"), [(False, 0), (True, 2 * 4000 // 64)], ids=["off", "on"]
)
def test_scrape_queue_estimate_is_a_setting(estimate: bool, expected: int) -> None:
    """Off (the default), a scraped view's queue is this gateway's own reservations only."""
    f = Fleet(scrape_queue_estimate=estimate)
    for i in ("a", "c"):
        f.upsert(EndpointSpec(i, f"http://{i}"))
    f.reserve("own", ["c"], {"c": 4000}, 0.0)
    f.report_load("a", LoadReport(waiting=2), 1.0)
    assert f.view("a", 1.5).pending_prefill == expected
