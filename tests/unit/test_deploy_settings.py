"""Every setting named in deploy/ exists in the services' settings classes: environment
variables of the compose services and of the Kubernetes containers, and the keys of the
settings files that ConfigMaps are generated from. Checked through the classes themselves
(tests/helpers/deploy.py), so the two cannot drift; a misspelt name is caught."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import yaml

from services.stack.plan import SERVICE_NAMES
from tests.helpers.deploy import (
    COMPOSE_FILE,
    K8S,
    compose_config,
    compose_env_errors,
    config_errors,
    config_load_errors,
    configmap_settings_files,
    env_setting_error,
    k8s_env_errors,
    kubectl,
    kustomizations,
    load_docs,
    manifest_files,
    pod_containers,
    process_of,
    render,
    settings_load_error,
)


@pytest.mark.parametrize(
    "env_file", [None, COMPOSE_FILE.parent / "pd.env"], ids=["aggregated", "prefill-decode"]
)
def test_compose_environment_names_settings(env_file: Path | None) -> None:
    model, error = compose_config(COMPOSE_FILE, env_file)
    assert model is not None, error
    assert compose_env_errors(model) == []


@pytest.mark.parametrize("path", manifest_files(), ids=lambda p: str(p.relative_to(K8S)))
def test_manifest_environment_names_settings(path: Path) -> None:
    assert k8s_env_errors(load_docs(path.read_text(encoding="utf-8"))) == []


@pytest.mark.skipif(kubectl() is None, reason="kubectl not found (see test_deploy_k8s.py)")
@pytest.mark.parametrize("directory", kustomizations(), ids=lambda p: str(p.relative_to(K8S)))
def test_rendered_environment_names_settings(directory: Path) -> None:
    docs, error = render(directory)
    assert error == ""
    assert k8s_env_errors(docs) == []


def test_configmaps_are_generated_from_settings_files() -> None:
    files = configmap_settings_files()
    assert K8S / "base" / "config" / "tideserve.yaml" in files
    for path in files:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        assert config_errors(data, str(path)) == []
        assert config_load_errors(path) == []


@pytest.mark.parametrize(
    ("name", "process", "message"),
    [
        (
            "TIDESERVE_SCHEDULER__ENDPOINTZ",
            "scheduler",
            "no setting 'endpointz' in SchedulerSettings",
        ),
        ("TIDESERVE_GRPC_PORTS", "kvmeta", "no setting 'grpc_ports' in KVMetaSettings"),
        ("TIDESERVE_ENGINE_PORTT", "engine", "no setting 'portt' in EngineSettings"),
        ("TIDESERVE_PORT", "engine", "the engine reads only TIDESERVE_ENGINE_*"),
        ("TIDESERVE_KV_BRIDGE__ENDPOINTS", "kv_bridge", "no setting 'endpoints'"),
        ("TIDESERVE_SCHEDULER__HTTP_PORT__X", "scheduler", "has no sub-settings"),
    ],
    ids=["section", "common", "engine", "engine-prefix", "kv-bridge", "not-nested"],
)
def test_unknown_setting_names_are_rejected(name: str, process: str, message: str) -> None:
    error = env_setting_error(name, process)
    assert error is not None and message in error, error


@pytest.mark.parametrize(
    ("name", "process"),
    [
        ("TIDESERVE_SCHEDULER__TENANTS__TEAM_A", "scheduler"),
        ("TIDESERVE_HTTP_PORT", "scheduler"),
        ("TIDESERVE_CONFIG", "kvmeta"),
        ("TIDESERVE_ENGINE_INSTANCE_ID", "engine"),
    ],
    ids=["mapping-key", "common-prefix-own-field", "config-path", "engine"],
)
def test_real_setting_names_are_accepted(name: str, process: str) -> None:
    assert env_setting_error(name, process) is None


def test_a_misspelt_setting_in_a_compose_copy_is_caught(tmp_path: Path) -> None:
    copy = tmp_path / "compose"
    copy.mkdir()
    for f in COMPOSE_FILE.parent.iterdir():
        (copy / f.name).write_bytes(f.read_bytes())
    path = copy / COMPOSE_FILE.name
    text = path.read_text(encoding="utf-8")
    path.write_text(text.replace("__KVMETA_ADDRESS:", "__KVMETA_ADRESS:", 1), encoding="utf-8")
    model, error = compose_config(path)
    assert model is not None, error
    errors = compose_env_errors(model)
    assert len(errors) == 1 and "no setting 'kvmeta_adress' in SchedulerSettings" in errors[0]


def test_a_misspelt_setting_in_a_manifest_copy_is_caught() -> None:
    text = (K8S / "overlays" / "kind" / "engines.yaml").read_text(encoding="utf-8")
    docs = load_docs(text.replace("TIDESERVE_ENGINE_INSTANCE_ID", "TIDESERVE_ENGINE_INSTANCEID"))
    errors = k8s_env_errors(docs)
    assert len(errors) == 1 and "StatefulSet/engine" in errors[0] and "instanceid" in errors[0]


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"kvmeta": {"checkpoint_every_s": 5}}, "kvmeta.no setting 'checkpoint_every_s'"),
        ({"schedular": {"http_port": 8000}}, "'schedular' is neither a common setting"),
        ({"kvmeta": {"grpc_port": "fifty"}}, "kvmeta.grpc_port"),
    ],
    ids=["unknown-key", "unknown-section", "wrong-type"],
)
def test_a_broken_settings_file_is_caught(tmp_path: Path, patch: dict, message: str) -> None:
    data = yaml.safe_load((K8S / "base" / "config" / "tideserve.yaml").read_text(encoding="utf-8"))
    for section, values in patch.items():
        data.setdefault(section, {}).update(values)
    path = tmp_path / "tideserve.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    errors = config_errors(data, "f") + config_load_errors(path)
    assert any(message in e for e in errors), errors


def _compose_processes(env_file: Path | None) -> list[tuple[str, str, dict[str, str]]]:
    model, error = compose_config(COMPOSE_FILE, env_file)
    assert model is not None, error
    out = []
    for name, svc in model["services"].items():
        process = process_of(svc.get("command") or [])
        if process is not None:
            out.append((name, process, dict(svc.get("environment") or {})))
    return out


@pytest.mark.parametrize(
    "env_file", [None, COMPOSE_FILE.parent / "pd.env"], ids=["aggregated", "prefill-decode"]
)
def test_compose_environment_values_load(
    env_file: Path | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # stores-init runs `tideserve stores provision`, a tool with no settings class
    processes = [p for p in _compose_processes(env_file) if p[1] != "tideserve stores"]
    assert {p for _, p, _ in processes} == {
        "scheduler",
        "kvmeta",
        "autoscaler",
        "telemetry",
        "engine",
    }
    for name, process, env in processes:
        with monkeypatch.context() as m:
            for key in [k for k in os.environ if k.startswith("TIDESERVE_")]:
                m.delenv(key)
            for key, value in env.items():
                m.setenv(key, value)
            assert settings_load_error(process) is None, name


def test_a_wrong_value_in_the_environment_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIDESERVE_SCHEDULER__ENDPOINTS", '["ftp://engine-1:30001"]')
    error = settings_load_error("scheduler")
    assert error is not None and "endpoints" in error
    monkeypatch.setenv("TIDESERVE_ENGINE_PORT", "thirty")
    error = settings_load_error("engine")
    assert error is not None and "port" in error


@pytest.mark.skipif(kubectl() is None, reason="kubectl not found (see test_deploy_k8s.py)")
@pytest.mark.parametrize("overlay", ["kind", "production"])
def test_overlay_settings_load(overlay: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each Tideserve container's settings, built as in the pod: the ConfigMap's file plus
    the literal environment (Secrets left out; `$(VAR)` references stood in for)."""
    docs, error = render(K8S / "overlays" / overlay)
    assert error == ""
    config = K8S / "base" / "config" / "tideserve.yaml"
    seen = set()
    for doc in docs:
        for c in pod_containers(doc):
            process = process_of([*c.get("command", []), *c.get("args", [])])
            if process is None or process == "tideserve stores":  # a tool with no settings
                continue
            seen.add(process)
            with monkeypatch.context() as m:
                for key in [k for k in os.environ if k.startswith("TIDESERVE_")]:
                    m.delenv(key)
                for env in c.get("env") or []:
                    if "value" in env and env["name"] != "TIDESERVE_CONFIG":
                        m.setenv(env["name"], re.sub(r"\$\((\w+)\)", "x", env["value"]))
                path = config if process in SERVICE_NAMES else None
                assert settings_load_error(process, path) is None, (
                    doc["metadata"]["name"],
                    c["name"],
                )
    assert set(SERVICE_NAMES) <= seen
