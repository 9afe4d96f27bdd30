"""The telemetry benchmarks' synthetic records are valid, unique and inside their span (a
benchmark whose records were rejected would measure the cheap path)."""

from __future__ import annotations

import importlib

from services.telemetry.windows.validate import ValidationRules, validate
from tests.helpers.records import NOW_MS


def test_records_and_clones_are_valid_unique_and_in_span() -> None:
    data = importlib.import_module("benchmarks._telemetry_data")
    query = importlib.import_module("benchmarks.telemetry_query")
    recs = data.records(500, NOW_MS, 600_000)
    clones = list(query.clones(500, NOW_MS))
    rules = ValidationRules(max_skew_ms=0, max_age_ms=3_600_000)
    for batch, span in ((recs, 600_000), (clones, query.SPAN_MS)):
        assert [validate(r, rules, NOW_MS) for r in batch] == [None] * len(batch)
        assert len({r.request_id for r in batch}) == len(batch)
        assert all(NOW_MS - span <= r.finish_ms < NOW_MS for r in batch)
        assert [r.finish_ms for r in batch] == sorted(r.finish_ms for r in batch)
        assert {r.disaggregated for r in batch} == {True, False}
