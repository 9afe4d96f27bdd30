"""SLO classes and tenants from settings → admission queue config, core targets, 400s."""

from __future__ import annotations

import json
from typing import Any

import pytest

from services.common.errors import SettingsError
from services.common.settings import load_settings
from services.scheduler.http.openai import ApiError, parse_request
from services.scheduler.main import build_gateway
from services.scheduler.settings import SchedulerSettings
from services.scheduler.slo import (
    DEFAULT_SLO_CLASSES,
    SLOClassConfig,
    known_tenants,
    queue_config,
    slo_targets,
)


def test_defaults_match_the_queue_and_core_defaults() -> None:
    cfg = queue_config(DEFAULT_SLO_CLASSES, default_class="agent")
    assert [(c.name, c.priority) for c in cfg.classes] == [
        ("interactive", 30),
        ("agent", 20),
        ("batch", 10),
    ]
    assert {c.name: c.max_queue_ms for c in cfg.classes} == {
        "interactive": 5_000.0,
        "agent": 30_000.0,
        "batch": 300_000.0,
    }
    assert slo_targets(DEFAULT_SLO_CLASSES).ttft_ms == {
        "interactive": 2_000.0,
        "agent": 10_000.0,
        "batch": 0.0,
    }


@pytest.mark.parametrize(
    ("classes", "default", "tenants", "max_total", "error"),
    [
        ([{"name": "a", "priority": 1}, {"name": "a", "priority": 2}], "a", {}, 10, "unique"),
        ([{"name": "a", "priority": 1}], "b", {}, 10, "default_class 'b'"),
        ([{"name": "a", "priority": 1}], "a", {"t": 0.0}, 10, "tenant weight of 't'"),
        ([{"name": "a", "priority": 1}], "a", {}, 0, "queue_max_total"),
        ([], "a", {}, 10, "non-empty"),
    ],
    ids=["duplicate-class", "unknown-default", "zero-weight", "zero-bound", "no-classes"],
)
def test_bad_configs_are_refused(
    classes: list[dict[str, Any]],
    default: str,
    tenants: dict[str, float],
    max_total: int,
    error: str,
) -> None:
    with pytest.raises(ValueError, match=error):
        queue_config(
            [SLOClassConfig(**c) for c in classes],
            default_class=default,
            tenants=tenants,
            max_total=max_total,
        )


def test_settings_from_yaml_reach_queue_core_and_gateway(tmp_path: Any) -> None:
    cfg = tmp_path / "tideserve.yaml"
    cfg.write_text(
        "scheduler:\n"
        "  http_port: 0\n"
        "  slo_classes:\n"
        "    - {name: gold, priority: 9, ttft_ms: 500, tpot_ms: 40, max_queue_ms: 100,"
        " max_queued: 3}\n"
        "    - {name: bronze, priority: 1, starve_after_ms: 1000}\n"
        "  default_slo_class: bronze\n"
        "  tenants: {acme: 3, beta: 1}\n"
        "  queue_max_total: 7\n"
    )
    s = load_settings(SchedulerSettings, "scheduler", str(cfg), {})
    core, gw = build_gateway(s)
    q = core.queue.config
    assert [(c.name, c.priority, c.max_queued) for c in q.classes] == [
        ("gold", 9, 3),
        ("bronze", 1, 10_000),
    ]
    assert q.default_class == "bronze" and q.max_total == 7
    assert dict(q.tenant_weights) == {"acme": 3.0, "beta": 1.0}
    assert core.slo.ttft_ms == {"gold": 500.0, "bronze": 0.0}
    assert core.slo.tpot_ms == {"gold": 40.0, "bronze": 0.0}
    assert core.ttft_budget_ms("gold") == 500.0 and core.ttft_budget_ms("") == 0.0
    assert gw.opts.tenants == frozenset({"acme", "beta"})


@pytest.mark.parametrize(
    ("yaml_text", "setting"),
    [
        ("scheduler:\n  default_slo_class: nope\n", "slo_classes"),
        ("scheduler:\n  tenants: {a: -1}\n", "tenant"),
        ("scheduler:\n  slo_classes: [{name: x}]\n", "slo_classes"),
    ],
    ids=["unknown-default-class", "negative-weight", "class-without-priority"],
)
def test_bad_settings_give_one_line(tmp_path: Any, yaml_text: str, setting: str) -> None:
    cfg = tmp_path / "tideserve.yaml"
    cfg.write_text(yaml_text)
    with pytest.raises(SettingsError) as e:
        load_settings(SchedulerSettings, "scheduler", str(cfg), {})
    assert setting in str(e.value) and "\n" not in str(e.value)


def _body(**kw: Any) -> bytes:
    return json.dumps({"model": "m", "prompt": "a b c", **kw}).encode()


@pytest.mark.parametrize(
    ("tenants", "headers", "body", "param", "code", "tenant"),
    [
        (None, {}, {}, None, None, ""),
        (None, {"X-Tideserve-Tenant": "anyone"}, {}, None, None, "anyone"),
        (frozenset({"acme"}), {"X-Tideserve-Tenant": "acme"}, {}, None, None, "acme"),
        (frozenset({"acme"}), {}, {"tenant": "acme"}, None, None, "acme"),
        (frozenset({"acme"}), {"X-Tideserve-Tenant": "evil"}, {}, "tenant", "invalid_value", ""),
        (frozenset({"acme"}), {}, {}, "tenant", "missing", ""),
        (None, {"X-Tideserve-Class": "gold"}, {}, "slo_class", "invalid_value", ""),
        (None, {}, {"slo_class": "gold"}, "slo_class", "invalid_value", ""),
    ],
    ids=[
        "any-tenant-none",
        "any-tenant-named",
        "known-header",
        "known-body",
        "unknown-tenant",
        "missing-tenant",
        "unknown-class-header",
        "unknown-class-body",
    ],
)
def test_class_and_tenant_validation(
    tenants: frozenset[str] | None,
    headers: dict[str, str],
    body: dict[str, Any],
    param: str | None,
    code: str | None,
    tenant: str,
) -> None:
    kw = {"models": (), "classes": ["interactive"], "tenants": tenants}
    if code is None:
        p = parse_request("completion", _body(**body), headers, **kw)  # type: ignore[arg-type]
        assert p.tenant == tenant and "tenant" not in p.forward_body
        return
    with pytest.raises(ApiError) as e:
        parse_request("completion", _body(**body), headers, **kw)  # type: ignore[arg-type]
    assert e.value.status == 400 and e.value.param == param and e.value.code == code


@pytest.mark.parametrize(
    ("tenants", "expected"),
    [({}, None), ({"a": 1.0, "b": 2.0}, frozenset({"a", "b"}))],
    ids=["empty-any", "configured"],
)
def test_known_tenants(tenants: dict[str, float], expected: frozenset[str] | None) -> None:
    assert known_tenants(tenants) == expected
