"""The stack's autoscaler child is told where telemetry and every gateway replica's gRPC
server are, in a form its settings read back (driver.scheduler_addresses for Drain), and
where kvmeta is (driver.kvmeta_address, for session migration)."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.autoscaler.settings import AutoscalerSettings
from services.common.settings import load_settings
from services.stack.gateways import GatewayReplicas
from services.stack.plan import build_service_children, choose_ports


@pytest.mark.parametrize(
    ("host", "offset", "gateways", "telemetry", "schedulers"),
    [
        ("127.0.0.1", 0, 1, "127.0.0.1:50054", ["127.0.0.1:50051"]),
        ("127.0.0.1", 10, 1, "127.0.0.1:50064", ["127.0.0.1:50061"]),
        ("0.0.0.0", 0, 2, "127.0.0.1:50054", ["127.0.0.1:50051", "127.0.0.1:50151"]),
    ],
    ids=["defaults", "port-offset", "two-gateways-bound-everywhere"],
)
def test_autoscaler_child_env_reads_back(
    host: str,
    offset: int,
    gateways: int,
    telemetry: str,
    schedulers: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    children = build_service_children(
        ports=choose_ports({}, offset),
        host=host,
        state_dir=tmp_path,
        config_path=None,
        base_env={},
        gateways=GatewayReplicas(count=gateways),
    )
    (child,) = [c for c in children if c.name == "autoscaler"]
    for key, value in child.env.items():
        if key.startswith("TIDESERVE_AUTOSCALER__"):
            monkeypatch.setenv(key, value)
    monkeypatch.chdir(tmp_path)  # no ./tideserve.yaml
    settings = load_settings(AutoscalerSettings, "autoscaler")
    assert settings.telemetry_address == telemetry
    assert settings.driver.scheduler_addresses == schedulers
    assert settings.driver.kvmeta_address == telemetry.rsplit(":", 1)[0] + f":{50052 + offset}"
