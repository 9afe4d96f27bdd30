"""The Grafana dashboard under deploy/grafana: valid dashboard shape, provisioned datasource,
and every panel expression naming only metrics that are exported — the telemetry and
autoscaler families agreed for issue 10, or names that exist in the code."""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
GRAFANA = ROOT / "deploy" / "grafana"
DASHBOARD = GRAFANA / "dashboards" / "tideserve.json"

# Exported by the telemetry service and the autoscaler (issue 10's agreed names).
AGREED = frozenset(
    {
        "tideserve_telemetry_window_ttft_ms",
        "tideserve_telemetry_window_tpot_ms",
        "tideserve_telemetry_window_cache_hit_ratio",
        "tideserve_telemetry_window_cached_tokens_error_ratio",
        "tideserve_telemetry_window_request_rate",
        "tideserve_telemetry_window_slo_attainment",
        "tideserve_telemetry_window_queue_ms",
        "tideserve_autoscaler_replicas",
        "tideserve_autoscaler_decisions_total",
    }
)
# What the dashboard must show (issue 10): percentiles, hit ratio and the router's error,
# queue depth, replicas per role, scaling decisions.
REQUIRED = frozenset(
    {
        "tideserve_telemetry_window_ttft_ms",
        "tideserve_telemetry_window_tpot_ms",
        "tideserve_telemetry_window_cache_hit_ratio",
        "tideserve_telemetry_window_cached_tokens_error_ratio",
        "tideserve_gateway_queue_depth",
        "tideserve_autoscaler_replicas",
        "tideserve_autoscaler_decisions_total",
    }
)
PANEL_TYPES = frozenset({"row", "timeseries", "stat", "gauge", "table", "barchart", "text"})
_METRIC = re.compile(r"\btideserve_[a-z0-9_]+\b")
_SUFFIXES = ("_bucket", "_count", "_sum", "_total", "_created")


@cache
def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return data


def panels() -> list[dict[str, Any]]:
    out = []
    for p in dashboard()["panels"]:
        out.append(p)
        out.extend(p.get("panels", []))
    return out


def expressions() -> list[tuple[str, str]]:
    return [(p["title"], t["expr"]) for p in panels() for t in p.get("targets", [])]


@cache
def source_text() -> str:
    return "\n".join(
        f.read_text(encoding="utf-8") for f in sorted((ROOT / "services").rglob("*.py"))
    )


def exported_in_code(name: str) -> bool:
    """A family name written in services/ (client-library suffixes stripped: a Counter
    ``x`` is exported as ``x_total``, a Histogram ``x`` as ``x_bucket``...)."""
    candidates = {name} | {name.removesuffix(s) for s in _SUFFIXES if name.endswith(s)}
    text = source_text()
    return any(f'"{c}"' in text for c in candidates)


def test_dashboard_shape() -> None:
    d = dashboard()
    assert isinstance(d["uid"], str) and d["uid"] and isinstance(d["title"], str)
    assert isinstance(d["schemaVersion"], int) and d["schemaVersion"] >= 30
    assert isinstance(d["panels"], list) and d["panels"]
    assert {"from", "to"} <= set(d["time"])
    ids = [p["id"] for p in panels()]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for p in panels():
        assert p["type"] in PANEL_TYPES, p["title"]
        pos = p["gridPos"]
        assert all(isinstance(pos[k], int) for k in ("h", "w", "x", "y")), p["title"]
        assert 0 <= pos["x"] and pos["x"] + pos["w"] <= 24, p["title"]
        if p["type"] == "row":
            continue
        assert p["targets"], f"{p['title']}: no queries"
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), p["title"]
    for var in d["templating"]["list"]:
        assert {"name", "type"} <= set(var)


def test_datasource_is_the_provisioned_one() -> None:
    provisioned = yaml.safe_load(
        (GRAFANA / "provisioning" / "datasources" / "prometheus.yaml").read_text()
    )
    (ds,) = provisioned["datasources"]
    assert ds["type"] == "prometheus"
    for p in panels():
        if p["type"] != "row":
            assert p["datasource"] == {"type": "prometheus", "uid": ds["uid"]}, p["title"]
    providers = yaml.safe_load(
        (GRAFANA / "provisioning" / "dashboards" / "tideserve.yaml").read_text()
    )["providers"]
    assert [p["type"] for p in providers] == ["file"]


@pytest.mark.parametrize(("title", "expr"), expressions(), ids=[t for t, _ in expressions()])
def test_every_expression_names_exported_metrics(title: str, expr: str) -> None:
    names = _METRIC.findall(expr)
    assert names, f"{title}: no tideserve metric in {expr!r}"
    for name in names:
        assert name in AGREED or exported_in_code(name), f"{title}: {name} is exported nowhere"
    for open_, close in ("()", "{}", "[]"):
        assert expr.count(open_) == expr.count(close), f"{title}: unbalanced {open_}{close}"


def test_the_required_views_are_there() -> None:
    used = {n for _, e in expressions() for n in _METRIC.findall(e)}
    assert REQUIRED <= used, f"missing: {sorted(REQUIRED - used)}"
    percentiles = [e for _, e in expressions() if "_ttft_ms" in e or "_tpot_ms" in e]
    assert all('"0.5|0.9|0.99"' in e and "slo_class" in e for e in percentiles)


def test_an_unknown_metric_is_caught() -> None:
    assert not exported_in_code("tideserve_gateway_no_such_thing")
    assert exported_in_code("tideserve_gateway_ttft_seconds_bucket")
