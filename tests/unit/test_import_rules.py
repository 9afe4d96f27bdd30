"""The dependency rule of the house, checked over the source of ``services/**.py`` (ast, no
import is executed).

Every module belongs to one *package*: ``services.<name>`` for a directory under
``services/``, and ``cli`` for ``services/cli.py``. The packages form layers, from the
bottom:

- ``common``: the shared runtime and the pure cores that more than one package runs (the
  routing framework and its plugins, the admission and scheduling cores, the engine model,
  the planner, the data plane library, the trace and statistics helpers). It imports no
  other package of ``services``.
- the services, ``scheduler``, ``kvmeta``, ``autoscaler``, ``telemetry``, ``engine``,
  ``kvbridge``, ``bench``, and the simulator ``sim``: each imports itself and ``common``,
  never another service, never ``stack``, never ``cli``. What two share lives in
  ``common``: the simulator replays traces through the same cores the services run because
  both import them from there.
- ``stack``: the local stack (``tideserve up/down/status``), a launcher that composes the
  services; it may import them all but not ``cli``.
- ``cli``: the top-level ``tideserve`` command (``services/cli.py``): it may import anything.

Every import counts: at module level, inside functions (deferred imports) and under
``if TYPE_CHECKING:``. A module-level import and a deferred one are the same dependency.

Modules must not import each other in a cycle (an import cycle among ``services`` modules,
deferred imports included, is reported with its path).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ROOT / "services"

LIBRARIES = frozenset({"common"})
SERVICE_PACKAGES = frozenset(
    {"scheduler", "kvmeta", "autoscaler", "telemetry", "engine", "kvbridge", "bench", "sim"}
)
COMPOSERS = ("stack", "cli")
"""Layers above the services, lowest first: each may import the ones below it."""


def allowed(package: str) -> frozenset[str]:
    """The packages ``package`` may import (itself included); ``""`` is ``services`` itself
    (``services/__init__.py``), which imports nothing, and which anyone may import."""
    if package == "":
        return frozenset({""})
    if package == "common":
        return frozenset({"common"})
    if package in SERVICE_PACKAGES:
        return LIBRARIES | {package}
    if package in COMPOSERS:
        below = COMPOSERS[: COMPOSERS.index(package) + 1]
        return LIBRARIES | SERVICE_PACKAGES | set(below)
    raise AssertionError(f"services/{package} belongs to no layer: add it to this test")


@dataclass(frozen=True)
class Import:
    importer: str
    """The importing module (``services.autoscaler.seam``)."""
    imported: str
    """The services module it names (the longest existing prefix of the import)."""
    line: int


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def package_of(module: str) -> str:
    """``services.cli`` -> ``cli``; ``services.stack.up`` -> ``stack``."""
    parts = module.split(".")
    return "cli" if parts == ["services", "cli"] else parts[1] if len(parts) > 1 else ""


def modules(root: Path) -> dict[str, Path]:
    return {module_name(p, root): p for p in sorted(root.rglob("*.py"))}


def _resolve(name: str, known: Mapping[str, Path]) -> str | None:
    """The module of ``known`` that ``name`` (a module, or a name inside one) refers to."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def imports(module: str, source: str, known: Mapping[str, Path]) -> Iterator[Import]:
    """Every import of a ``services`` module in ``source`` (absolute and relative)."""
    package_parts = module.split(".")
    if not known[module].name == "__init__.py":
        package_parts = package_parts[:-1]
    for node in ast.walk(ast.parse(source)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package_parts[: len(package_parts) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            names = [f"{base}.{a.name}" for a in node.names]
        for name in names:
            if not name.startswith("services"):
                continue
            target = _resolve(name, known)
            if target is not None and target != module:
                yield Import(module, target, node.lineno)


def graph(root: Path) -> dict[str, list[Import]]:
    known = modules(root)
    return {m: list(imports(m, p.read_text(encoding="utf-8"), known)) for m, p in known.items()}


def layer_violations(g: Mapping[str, list[Import]]) -> list[str]:
    out = []
    for module, found in g.items():
        ok = allowed(package_of(module)) | {""}
        for imp in found:
            if package_of(imp.imported) not in ok:
                out.append(f"{module}:{imp.line} imports {imp.imported}")
    return sorted(set(out))


def cycles(g: Mapping[str, list[Import]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each as one
    cycle through it, starting at its smallest module name."""
    succ = {m: sorted({i.imported for i in found}) for m, found in g.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    comps: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in succ.get(v, []):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(comp)

    for m in sorted(succ):
        if m not in index:
            visit(m)
    return [_cycle_through(comp, succ) for comp in comps]


def _cycle_through(comp: set[str], succ: Mapping[str, list[str]]) -> list[str]:
    """A shortest path from the smallest module of ``comp`` back to itself (BFS)."""
    start = min(comp)
    parent: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in succ[v]:
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(parent[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if w in comp and w not in parent:
                    parent[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"not a cycle: {sorted(comp)}")


# --------------------------------------------------------------------------- the rules


def test_every_package_is_in_a_layer() -> None:
    for package in sorted({package_of(m) for m in modules(SERVICES)}):
        allowed(package)


def test_no_package_imports_across_its_layer() -> None:
    assert layer_violations(graph(SERVICES)) == []


def test_no_import_cycles() -> None:
    assert [" -> ".join(c) for c in cycles(graph(SERVICES))] == []


# --------------------------------------------------------------------------- the checker


def _tree(tmp_path: Path, files: Mapping[str, str]) -> Path:
    root = tmp_path / "services"
    for rel, text in {"__init__.py": "", **files}.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


@pytest.mark.parametrize(
    ("files", "violations"),
    [
        pytest.param(
            {"kvmeta/__init__.py": "", "common/__init__.py": "", "common/x.py": "import json\n"},
            [],
            id="third-party-only",
        ),
        pytest.param(
            {"autoscaler/seam.py": "from services.scheduler.http.upstream import scrape_load\n",
             "scheduler/http/upstream.py": ""},
            ["services.autoscaler.seam:1 imports services.scheduler.http.upstream"],
            id="service-imports-service",
        ),
        pytest.param(
            {"telemetry/cli.py": "def f():\n    from services.stack.state import read_state\n",
             "stack/state.py": ""},
            ["services.telemetry.cli:2 imports services.stack.state"],
            id="deferred-import-of-the-stack",
        ),
        pytest.param(
            {"autoscaler/cli.py": "from services.cli import kinds\n", "cli.py": ""},
            ["services.autoscaler.cli:1 imports services.cli"],
            id="service-imports-top-cli",
        ),
        pytest.param(
            {"common/otel.py": "from services import kvmeta\n", "kvmeta/__init__.py": ""},
            ["services.common.otel:1 imports services.kvmeta"],
            id="common-imports-service-package",
        ),
        pytest.param(
            {"sim/run.py": "import services.engine.core\n", "engine/core.py": ""},
            ["services.sim.run:1 imports services.engine.core"],
            id="simulator-imports-service",
        ),
        pytest.param(
            {"stack/up.py": "from services.cli import main\n", "cli.py": ""},
            ["services.stack.up:1 imports services.cli"],
            id="stack-imports-top-cli",
        ),
        pytest.param(
            {"stack/up.py": "from services.scheduler.cli import register\n",
             "scheduler/cli.py": "from services.common.x import y\n",
             "common/x.py": "", "cli.py": "import services.stack.up\n"},
            [],
            id="composers-import-below",
        ),
        pytest.param(
            {"engine/kv.py": "from services.common.dataplane import blocks\n",
             "common/dataplane/blocks.py": "from .. import clock\n", "common/clock.py": "",
             "common/dataplane/__init__.py": ""},
            [],
            id="service-imports-common",
        ),
        pytest.param(
            {"common/a.py": "from ..scheduler import core\n", "scheduler/core.py": ""},
            ["services.common.a:1 imports services.scheduler.core"],
            id="relative-import",
        ),
    ],
)  # fmt: skip
def test_layer_violations_found(
    tmp_path: Path, files: Mapping[str, str], violations: list[str]
) -> None:
    assert layer_violations(graph(_tree(tmp_path, files))) == violations


@pytest.mark.parametrize(
    ("files", "found"),
    [
        pytest.param(
            {"common/a.py": "from services.common.b import x\n", "common/b.py": ""},
            [],
            id="none",
        ),
        pytest.param(
            {"common/a.py": "from services.common.b import x\n",
             "common/b.py": "def f():\n    from services.common.a import y\n"},
            [["services.common.a", "services.common.b", "services.common.a"]],
            id="deferred-two",
        ),
        pytest.param(
            {"stack/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                           "    from services.stack.c import C\n",
             "stack/b.py": "import services.stack.a\n",
             "stack/c.py": "from services.stack import b\n"},
            [["services.stack.a", "services.stack.c", "services.stack.b", "services.stack.a"]],
            id="type-checking-three",
        ),
    ],
)  # fmt: skip
def test_cycles_found(tmp_path: Path, files: Mapping[str, str], found: list[list[str]]) -> None:
    assert cycles(graph(_tree(tmp_path, files))) == found
