"""Gateway pure parts: circuit breaker, fleet health/reservations/snapshot, core capacity,
OpenAI request parsing."""

from __future__ import annotations

import json
from typing import Any

import pytest

from services.common.routing.types import Pick
from services.common.scheduling import CoreLimits, EndpointSpec, LoadReport, build_core
from services.common.scheduling.fleet import CircuitBreaker, Fleet
from services.scheduler.http.openai import ApiError, Limits, parse_request
from tests.unit._routing_helpers import req


@pytest.mark.parametrize(
    ("events", "now", "state"),
    [
        ([], 0.0, "closed"),
        ([("f", 0.0), ("f", 0.1)], 0.2, "closed"),
        ([("f", 0.0), ("f", 0.1), ("f", 0.2)], 0.3, "open"),
        ([("f", 0.0), ("f", 0.1), ("f", 0.2)], 5.3, "half-open"),
        ([("f", 0.0), ("f", 0.1), ("f", 0.2), ("s", 5.5)], 5.6, "closed"),
        ([("f", 0.0), ("f", 0.1), ("f", 0.2), ("f", 5.5)], 5.6, "open"),  # half-open probe failed
        ([("f", 0.0), ("f", 0.1), ("s", 0.2), ("f", 0.3)], 0.4, "closed"),  # success resets
    ],
    ids=["fresh", "below-threshold", "opens", "half-open", "recovers", "reopens", "reset"],
)
def test_circuit_breaker(events: list[tuple[str, float]], now: float, state: str) -> None:
    cb = CircuitBreaker(failures=3, open_s=5.0)
    for kind, t in events:
        (cb.failure if kind == "f" else cb.success)(t)
    assert cb.state(now) == state


def fleet() -> Fleet:
    f = Fleet(unhealthy_after=2, load_stale_s=10.0)
    f.upsert(EndpointSpec("a", "http://a"))
    f.upsert(EndpointSpec("b", "http://b", role="decode"))
    return f


def test_probe_marks_unhealthy_after_consecutive_failures() -> None:
    f = fleet()
    f.probe("a", False, 0.0)
    assert f.view("a", 0.0).healthy
    f.probe("a", False, 1.0)
    assert not f.view("a", 1.0).healthy
    f.probe("a", True, 2.0)
    assert f.view("a", 2.0).healthy


@pytest.mark.parametrize(
    ("report", "ours", "pending", "expected_reserved", "expected_tokens"),
    [
        (None, 2, 100, 2, 100),
        (LoadReport(running=1, waiting=0, pending_prefill_tokens=40), 2, 100, 1, 60),
        (LoadReport(running=5, waiting=3, pending_prefill_tokens=500), 2, 100, 0, 0),
    ],
    ids=["no-report", "partly-reported", "fully-reported"],
)
def test_reservations_count_max_of_reported_and_ours(
    report: LoadReport | None, ours: int, pending: int, expected_reserved: int, expected_tokens: int
) -> None:
    f = fleet()
    if report:
        f.report_load("a", report, 0.0)
    for i in range(ours):
        f.reserve(f"p{i}", ["a"], {"a": pending // ours}, 0.0)
    v = f.view("a", 1.0)
    assert (v.reserved_requests, v.reserved_tokens) == (expected_reserved, expected_tokens)


def test_reservation_lifecycle_is_idempotent() -> None:
    f = fleet()
    f.reserve("p", ["a", "b", "a", "ghost"], {"a": 50}, 0.0)
    assert (f.in_flight("a"), f.in_flight("b")) == (1, 1)
    f.first_token("p")
    assert f.view("a", 0.0).reserved_tokens == 0 and f.view("a", 0.0).reserved_requests == 1
    assert f.release("p") and not f.release("p")
    assert (f.in_flight("a"), f.in_flight("b")) == (0, 0)
    f.reserve("old", ["a"], {}, 0.0)
    assert f.expire_reservations(100.0, 50.0) == ["old"] and f.in_flight("a") == 0


def test_stale_load_is_ignored_and_drain_flag() -> None:
    f = fleet()
    f.report_load("a", LoadReport(waiting=9, kv_usage=0.5), 0.0)
    assert f.view("a", 5.0).waiting == 9 and f.view("a", 11.0).waiting == 0
    assert f.set_draining("a", True) == 0 and f.view("a", 0.0).draining
    with pytest.raises(KeyError):
        f.set_draining("zzz", True)
    assert [e.instance_id for e in f.snapshot(0.0)] == ["a", "b"]


def test_core_pick_reserves_and_capacity_follows_saturation() -> None:
    core = build_core(
        [EndpointSpec("w1", "http://w1"), EndpointSpec("w2", "http://w2")],
        perf_profile="test",
        limits=CoreLimits(
            max_in_flight_per_endpoint=2, saturation_kv_usage=0.9, saturation_waiting=8
        ),
    )
    assert core.capacity(0.0) == 4
    d = core.pick(req(prompt_tokens=64), 0.0, "p1")
    assert isinstance(d, Pick) and core.capacity(0.0) == 3
    assert core.release("p1") and not core.release("p1") and core.capacity(0.0) == 4
    core.fleet.report_load("w1", LoadReport(kv_usage=0.95), 0.0)
    assert core.capacity(0.0) == 2
    core.fleet.report_load("w2", LoadReport(waiting=8), 0.0)
    assert core.capacity(0.0) == 0


@pytest.mark.parametrize(
    ("cls", "deadline", "budget"),
    [
        ("interactive", None, 2000.0),
        ("", None, 10_000.0),
        ("batch", None, 0.0),
        ("interactive", 500.0, 500.0),
        ("batch", 700.0, 700.0),
    ],
    ids=["class", "default-class", "no-target", "deadline-tighter", "deadline-only"],
)
def test_ttft_budget(cls: str, deadline: float | None, budget: float) -> None:
    core = build_core([], perf_profile="test")
    assert core.ttft_budget_ms(cls, deadline) == budget


def _parse(body: Any, headers: dict[str, str] | None = None, kind: str = "chat") -> Any:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return parse_request(
        kind,  # type: ignore[arg-type]
        raw,
        headers or {},
        models={"m"},
        classes={"interactive", "agent", "batch"},
        limits=Limits(max_body_bytes=10_000, max_tokens=1000, max_prompt_tokens=50, max_messages=3),
    )


def test_parse_chat_metadata_from_headers_and_body_and_stripped_from_forward() -> None:
    p = _parse(
        {
            "model": "m",
            "messages": [{"role": "user", "content": [{"type": "text", "text": "hi there"}]}],
            "tenant": "body-t",
            "slo_class": "batch",
            "session_id": "s1",
            "cache_salt": "salt",
        },
        {"X-Tideserve-Tenant": "hdr-t", "X-Tideserve-Deadline-Ms": "250"},
    )
    assert (p.tenant, p.slo_class, p.session_id, p.cache_salt) == ("hdr-t", "batch", "s1", "salt")
    assert p.deadline_ms == 250.0 and len(p.prompt_ids) == 3  # "user:", "hi", "there"
    assert "tenant" not in p.forward_body and p.forward_body["cache_salt"] == "salt"
    assert p.raw_body == b""  # re-encoded without our fields


@pytest.mark.parametrize(
    ("extra", "raw_forwarded"),
    [
        ({}, True),
        ({"session_id": "s"}, False),
        ({"tenant": "t"}, False),
        ({"slo_class": ""}, False),
    ],
    ids=["none-of-ours", "session", "tenant", "empty-class"],
)
def test_a_body_without_our_fields_is_forwarded_as_sent(
    extra: dict[str, str], raw_forwarded: bool
) -> None:
    body = {"model": "m", "prompt": "a b c", "max_tokens": 4, **extra}
    raw = json.dumps(body, indent=1).encode()
    p = parse_request("completion", raw, {}, models=[], classes=["batch"])
    assert (p.raw_body == raw) is raw_forwarded and bool(p.raw_body) is raw_forwarded
    assert p.forward_body == {k: v for k, v in body.items() if k not in extra}


@pytest.mark.parametrize(
    ("kind", "body", "headers", "status", "code"),
    [
        ("chat", b"\xff\xfe", {}, 400, "invalid_json"),
        ("chat", b"x" * 10_001, {}, 413, "body_too_large"),
        ("completion", {"model": "m"}, {}, 400, "missing"),
        ("completion", {"model": "m", "prompt": [1, -2]}, {}, 400, "invalid_type"),
        ("completion", {"model": "m", "prompt": "w " * 51}, {}, 413, "prompt_too_long"),
        ("completion", {"model": "m", "prompt": "   "}, {}, 400, "empty"),
        ("chat", {"model": "m", "messages": [{"content": "x"}]}, {}, 400, "invalid_type"),
        (
            "chat",
            {"model": "m", "messages": [{"role": "u", "content": "x"}], "max_completion_tokens": 0},
            {},
            400,
            "invalid_value",
        ),
        (
            "chat",
            {"model": "m", "messages": [{"role": "u", "content": "x"}]},
            {"X-Tideserve-Deadline-Ms": "-1"},
            400,
            "invalid_value",
        ),
        (
            "generate",
            {"text": "a", "sampling_params": {"max_new_tokens": 5000}},
            {},
            400,
            "invalid_value",
        ),
        (
            "chat",
            {"model": "m", "messages": [{"role": "u", "content": "x"}] * 4},
            {},
            400,
            "too_many_messages",
        ),
    ],
    ids=[
        "bad-utf8",
        "too-large",
        "no-prompt",
        "negative-token-id",
        "prompt-too-long",
        "empty-prompt",
        "no-role",
        "zero-max-completion",
        "bad-deadline",
        "generate-max-new",
        "too-many-messages",
    ],
)
def test_parse_errors(
    kind: str, body: Any, headers: dict[str, str], status: int, code: str | None
) -> None:
    with pytest.raises(ApiError) as info:
        _parse(body, headers, kind)
    assert info.value.status == status and info.value.code == code
    assert set(info.value.body()["error"]) == {"message", "type", "param", "code"}


def test_parse_generate_and_token_prompts() -> None:
    g = _parse({"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 3}}, kind="generate")
    assert g.prompt_ids == (5, 6, 7) and g.max_tokens == 3 and g.model == ""
    c = _parse({"model": "m", "prompt": ["a b"]}, kind="completion")
    assert len(c.prompt_ids) == 2 and c.max_tokens == 256


def test_cached_views_follow_every_change_and_time() -> None:
    f = Fleet(breaker_failures=1, breaker_open_s=5.0, load_stale_s=10.0)
    f.upsert(EndpointSpec("a", "http://a"))
    assert f.view("a", 0.0).circuit == "closed"
    f.upstream_result("a", False, 1.0)
    assert f.view("a", 1.0).circuit == "open"
    assert f.view("a", 5.9).circuit == "open" and f.view("a", 6.0).circuit == "half-open"
    f.report_load("a", LoadReport(waiting=3), 6.0)
    assert f.view("a", 7.0).waiting == 3 and f.view("a", 16.5).waiting == 0  # stale
    f.reserve("p", ["a"], {"a": 10}, 17.0)
    assert f.view("a", 17.0).reserved_requests == 1
    f.set_remote_in_flight({"a": (2, 5)})
    assert (f.view("a", 17.0).reserved_requests, f.view("a", 17.0).reserved_tokens) == (3, 15)
    f.set_draining("a", True)
    f.probe("a", False, 17.0)
    f.probe("a", False, 17.0)
    v = f.view("a", 17.0)
    assert v.draining and not v.healthy
    f.upsert(EndpointSpec("a", "http://a2"))
    assert f.view("a", 17.0).url == "http://a2"
