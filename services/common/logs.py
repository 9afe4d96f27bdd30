"""Structured logging: one JSON object per line (or plain text), on stderr by default.

``configure_logging`` replaces the root handlers it installed before, so it is idempotent.
Extra fields passed as ``logger.info("msg", extra={"deployment": "d1"})`` become JSON keys.

Correlation: every line logged while an OpenTelemetry span is current carries its
``trace_id`` and ``span_id`` (W3C hex), and every line logged inside
:func:`request_scope` (the gateway opens one per request) its ``request_id`` — as JSON keys,
or ``key=value`` in text. Lines outside a request or span (startup, background loops) have
none. Explicit ``extra=`` values of the same names win.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
from collections.abc import Iterator
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any, Literal, TextIO

from opentelemetry import trace

__all__ = [
    "CorrelationFilter",
    "JsonFormatter",
    "TextFormatter",
    "configure_logging",
    "request_scope",
]

_REQUEST_ID: ContextVar[str] = ContextVar("tideserve_request_id", default="")


@contextlib.contextmanager
def request_scope(request_id: str) -> Iterator[None]:
    """Log lines within the block (in this task and tasks it starts) carry ``request_id``."""
    token = _REQUEST_ID.set(request_id)
    try:
        yield
    finally:
        _REQUEST_ID.reset(token)


class CorrelationFilter(logging.Filter):
    """Adds ``trace_id``/``span_id`` of the current span and the bound ``request_id``."""

    def filter(self, record: logging.LogRecord) -> bool:
        ctx = trace.get_current_span().get_span_context()
        if ctx.is_valid and not hasattr(record, "trace_id"):
            record.trace_id = f"{ctx.trace_id:032x}"
            record.span_id = f"{ctx.span_id:016x}"
        rid = _REQUEST_ID.get()
        if rid and not hasattr(record, "request_id"):
            record.request_id = rid
        return True


# Attributes every LogRecord has; anything else on a record came from ``extra=``.
_STANDARD = frozenset(
    vars(logging.LogRecord("x", logging.INFO, "x", 0, "x", None, None)).keys()
    | {"message", "asctime", "taskName"}
)


def _timestamp(record: logging.LogRecord) -> str:
    moment = datetime.fromtimestamp(record.created, tz=UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")}


class JsonFormatter(logging.Formatter):
    """``{"ts", "level", "service", "logger", "msg", ...extras, "exc"?}`` on one line."""

    def __init__(self, service: str) -> None:
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": _timestamp(record),
            "level": record.levelname,
            "service": self.service,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        entry.update(_extras(record))
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """``<ts> <LEVEL> <service> <logger>: <msg> key=value ...`` for humans."""

    def __init__(self, service: str) -> None:
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        fields = " ".join(f"{k}={v}" for k, v in _extras(record).items())
        line = (
            f"{_timestamp(record)} {record.levelname} {self.service} {record.name}: "
            f"{record.getMessage()}"
        )
        if fields:
            line = f"{line} {fields}"
        if record.exc_info:
            line = f"{line}\n{self.formatException(record.exc_info)}"
        return line


# Third-party loggers that are noisy at INFO (alembic announces every plugin at import).
_QUIET_LOGGERS = {"alembic.runtime.plugins": logging.WARNING}


class _TideserveHandler(logging.StreamHandler[TextIO]):
    """Marker subclass so a second ``configure_logging`` call replaces, not duplicates."""


def configure_logging(
    level: str | int,
    fmt: Literal["json", "text"] | str,
    service: str,
    stream: TextIO | None = None,
) -> logging.Handler:
    """Send all logging to ``stream`` (default stderr) as JSON lines or text; returns the handler.

    Raises ``ValueError`` for an unknown format or level name.
    """
    if fmt == "json":
        formatter: logging.Formatter = JsonFormatter(service)
    elif fmt == "text":
        formatter = TextFormatter(service)
    else:
        raise ValueError(f"unknown log format {fmt!r} (json or text)")
    numeric = level if isinstance(level, int) else logging.getLevelNamesMapping().get(level.upper())
    if numeric is None:
        raise ValueError(f"unknown log level {level!r}")
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _TideserveHandler)]:
        root.removeHandler(old)
        old.close()
    handler = _TideserveHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(formatter)
    handler.addFilter(CorrelationFilter())
    root.addHandler(handler)
    root.setLevel(numeric)
    for name, quiet in _QUIET_LOGGERS.items():
        logging.getLogger(name).setLevel(max(quiet, numeric))
    logging.captureWarnings(True)
    return handler
