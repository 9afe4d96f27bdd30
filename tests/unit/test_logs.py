"""Structured logging: JSON lines with extras and exceptions, text format, idempotent setup."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from services.common.logs import configure_logging


@pytest.fixture(autouse=True)
def _restore_root() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        if handler not in handlers:
            root.removeHandler(handler)
    root.setLevel(level)


def test_json_line_fields_and_extras() -> None:
    out = io.StringIO()
    configure_logging("INFO", "json", "kvmeta", stream=out)
    logging.getLogger("t.json").info("applied %d events", 3, extra={"deployment": "d1"})
    entry = json.loads(out.getvalue())
    assert entry["level"] == "INFO"
    assert entry["service"] == "kvmeta"
    assert entry["logger"] == "t.json"
    assert entry["msg"] == "applied 3 events"
    assert entry["deployment"] == "d1"
    assert entry["ts"].endswith("Z")


def test_json_exception_stays_one_line() -> None:
    out = io.StringIO()
    configure_logging("INFO", "json", "scheduler", stream=out)
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logging.getLogger("t.exc").exception("failed")
    lines = out.getvalue().splitlines()
    assert len(lines) == 1
    entry = json.loads(lines[0])
    assert "RuntimeError: boom" in entry["exc"]


def test_level_filters() -> None:
    out = io.StringIO()
    configure_logging("WARNING", "json", "telemetry", stream=out)
    logging.getLogger("t.lvl").info("hidden")
    logging.getLogger("t.lvl").warning("shown")
    assert [json.loads(line)["msg"] for line in out.getvalue().splitlines()] == ["shown"]


def test_text_format() -> None:
    out = io.StringIO()
    configure_logging("debug", "text", "autoscaler", stream=out)
    logging.getLogger("t.text").debug("scaled", extra={"role": "decode"})
    line = out.getvalue().strip()
    assert " DEBUG autoscaler t.text: scaled role=decode" in line


def test_configure_twice_replaces_handler() -> None:
    first, second = io.StringIO(), io.StringIO()
    configure_logging("INFO", "json", "kvmeta", stream=first)
    configure_logging("INFO", "json", "kvmeta", stream=second)
    logging.getLogger("t.twice").info("once")
    assert first.getvalue() == ""
    assert len(second.getvalue().splitlines()) == 1


@pytest.mark.parametrize(
    ("level", "fmt"), [("INFO", "xml"), ("LOUD", "json")], ids=["bad-format", "bad-level"]
)
def test_bad_arguments(level: str, fmt: str) -> None:
    with pytest.raises(ValueError, match="unknown log"):
        configure_logging(level, fmt, "kvmeta", stream=io.StringIO())


def _traced_line(fmt: str, request_id: str | None) -> tuple[str, str, str]:
    """One line logged inside a recorded span (and a request scope when ``request_id``);
    returns (output, trace id, span id)."""
    import contextlib

    from opentelemetry.sdk.trace import TracerProvider

    from services.common.logs import request_scope

    out = io.StringIO()
    configure_logging("INFO", fmt, "scheduler", stream=out)
    tracer = TracerProvider().get_tracer("t")
    scope = request_scope(request_id) if request_id else contextlib.nullcontext()
    with tracer.start_as_current_span("req") as span, scope:
        logging.getLogger("t.corr").info("routed")
    ctx = span.get_span_context()
    return out.getvalue(), f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}"


@pytest.mark.parametrize("request_id", ["r-42", None], ids=["in-request", "span-only"])
def test_json_lines_carry_trace_and_request_ids(request_id: str | None) -> None:
    out, trace_id, span_id = _traced_line("json", request_id)
    entry = json.loads(out)
    assert (entry["trace_id"], entry["span_id"]) == (trace_id, span_id)
    assert entry.get("request_id") == request_id


def test_text_lines_carry_trace_and_request_ids() -> None:
    out, trace_id, span_id = _traced_line("text", "r-7")
    assert f"trace_id={trace_id}" in out and f"span_id={span_id}" in out
    assert "request_id=r-7" in out


def test_lines_outside_a_request_have_no_ids() -> None:
    out = io.StringIO()
    configure_logging("INFO", "json", "scheduler", stream=out)
    logging.getLogger("t.corr").info("startup")
    entry = json.loads(out.getvalue())
    assert "trace_id" not in entry and "request_id" not in entry


def test_explicit_extra_wins() -> None:
    from services.common.logs import request_scope

    out = io.StringIO()
    configure_logging("INFO", "json", "scheduler", stream=out)
    with request_scope("bound"):
        logging.getLogger("t.corr").info("x", extra={"request_id": "given"})
    assert json.loads(out.getvalue())["request_id"] == "given"


def test_gateway_access_lines_carry_the_requests_ids() -> None:
    from aiohttp import web
    from aiohttp.test_utils import make_mocked_request

    from services.scheduler.core.records import RequestContext
    from services.scheduler.http.records import CONTEXT_KEY, AccessLogger

    out = io.StringIO()
    configure_logging("INFO", "json", "scheduler", stream=out)
    req = make_mocked_request("POST", "/v1/chat/completions")
    req[CONTEXT_KEY] = RequestContext("rid-1", "ab" * 16, 0.0, 0.0)
    AccessLogger(logging.getLogger("aiohttp.access"), "").log(req, web.Response(status=429), 0.0015)
    entry = json.loads(out.getvalue())
    assert entry["msg"] == "POST /v1/chat/completions 429"
    assert (entry["trace_id"], entry["request_id"], entry["status"]) == ("ab" * 16, "rid-1", 429)
    assert entry["ms"] == 1.5
