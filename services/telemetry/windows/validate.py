"""Validation of one ``RequestRecord`` (pure): accepted, or a :class:`Rejection` with a reason.

Rules, in order (the first that fails is the reason):

- ``empty_request_id``: ``request_id`` is empty (idempotence is keyed on it);
- ``nul_in_text``: a text field (at any depth) holds a NUL character, which Postgres text
  cannot store (without this rule the whole batch's transaction would fail);
- ``unknown_deployment``: ``deployment`` is empty, or ``known_deployments`` is non-empty and
  does not list it. "Known" means: named in the telemetry setting ``deployments``; an empty
  setting (the default, and the local stack) knows every non-empty deployment name;
- ``missing_timing``: ``arrival_ms`` or ``finish_ms`` is not set (<= 0), a latency is NaN or
  infinite, or a request that succeeded (``REQUEST_OUTCOME_OK``) has no ``ttft_ms`` or
  ``e2e_ms`` (a failed or shed request may lack them);
- ``negative_timing``: ``queue_ms``, ``ttft_ms``, ``tpot_ms``, ``e2e_ms`` or
  ``kv_transfer_ms`` is below 0, or a token count is below 0;
- ``finish_before_arrival``: ``finish_ms < arrival_ms``;
- ``future``: ``finish_ms`` later than ``now_ms + max_skew_ms`` (clocks of gateways and
  telemetry differ by at most the skew);
- ``too_old``: ``finish_ms`` earlier than ``now_ms - max_age_ms`` (it would land in a
  partition retention has already dropped).
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass

from google.protobuf.message import Message
from tideserve.v1 import events_pb2

__all__ = ["REASONS", "Rejection", "ValidationRules", "validate"]

REASONS = (
    "empty_request_id",
    "unknown_deployment",
    "missing_timing",
    "negative_timing",
    "finish_before_arrival",
    "future",
    "too_old",
    "nul_in_text",
)
"""Every rejection code (bounded: a Prometheus label)."""

_LATENCIES = ("queue_ms", "ttft_ms", "tpot_ms", "e2e_ms", "kv_transfer_ms")
_COUNTS = ("prompt_tokens", "completion_tokens", "cached_tokens", "predicted_cached_tokens")
_NAMED = (*_LATENCIES, *_COUNTS)
_OK = events_pb2.REQUEST_OUTCOME_OK


def _nul_field(msg: Message) -> str | None:
    """The name of the first string field of ``msg`` (nested ones included) holding NUL.
    (Records have no map fields.)"""
    for field, value in msg.ListFields():
        values = list(value) if field.is_repeated else [value]
        if field.type == field.TYPE_STRING and any("\x00" in v for v in values):
            return field.name
        if field.type == field.TYPE_MESSAGE:
            for sub in values:
                inner = _nul_field(sub)
                if inner is not None:
                    return f"{field.name}.{inner}"
    return None


@dataclass(frozen=True)
class ValidationRules:
    known_deployments: frozenset[str] = frozenset()
    max_skew_ms: int = 60_000
    max_age_ms: int = 7 * 86_400_000

    @classmethod
    def of(cls, deployments: Collection[str], max_skew_ms: int, max_age_ms: int) -> ValidationRules:
        return cls(frozenset(deployments), max_skew_ms, max_age_ms)


@dataclass(frozen=True)
class Rejection:
    code: str
    detail: str

    def line(self, request_id: str) -> str:
        """``"<request_id>: <code>: <detail>"`` (ReportRecords errors, dead letters)."""
        return f"{request_id or '<no request_id>'}: {self.code}: {self.detail}"


def validate(
    record: events_pb2.RequestRecord, rules: ValidationRules, now_ms: int
) -> Rejection | None:
    """None when ``record`` is accepted, else the first rule it breaks (module doc)."""
    if not record.request_id:
        return Rejection("empty_request_id", "request_id is empty")
    nul = _nul_field(record)
    if nul is not None:
        return Rejection("nul_in_text", f"{nul} holds a NUL character")
    dep = record.deployment
    if not dep or (rules.known_deployments and dep not in rules.known_deployments):
        return Rejection("unknown_deployment", f"deployment {dep!r} is not known")
    arrival, finish = record.arrival_ms, record.finish_ms
    if arrival <= 0 or finish <= 0:
        return Rejection("missing_timing", "arrival_ms or finish_ms is not set")
    latencies = (
        record.queue_ms,
        record.ttft_ms,
        record.tpot_ms,
        record.e2e_ms,
        record.kv_transfer_ms,
    )
    if not all(map(math.isfinite, latencies)):
        bad = next(f for f, v in zip(_LATENCIES, latencies, strict=True) if not math.isfinite(v))
        return Rejection("missing_timing", f"{bad} is not a finite number")
    if record.outcome == _OK and (latencies[1] <= 0 or latencies[3] <= 0):
        return Rejection("missing_timing", "a successful request without ttft_ms or e2e_ms")
    counts = (
        record.prompt_tokens,
        record.completion_tokens,
        record.cached_tokens,
        record.predicted_cached_tokens,
    )
    if min(latencies) < 0 or min(counts) < 0:
        values = (*latencies, *counts)
        bad = next(f for f, v in zip(_NAMED, values, strict=True) if v < 0)
        return Rejection("negative_timing", f"{bad} is negative")
    if finish < arrival:
        return Rejection(
            "finish_before_arrival",
            f"finish_ms {finish} < arrival_ms {arrival}",
        )
    if finish > now_ms + rules.max_skew_ms:
        ahead = finish - now_ms
        return Rejection("future", f"finish_ms is {ahead} ms in the future")
    if finish < now_ms - rules.max_age_ms:
        return Rejection("too_old", "finish_ms is older than the retention")
    return None
