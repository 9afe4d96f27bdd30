"""Deployment specs: the YAML schema (pydantic, frozen) and its validation.

A spec is refused naming the field: ``roles[1].min_replicas`` for min > max, an unknown role
kind or engine kind (``roles[0].engine``), replicas outside [min, max], ratio bounds that
contradict the roles' min/max, negative SLO targets, dependencies on unknown roles or in a
cycle, an unknown perf profile. :func:`parse_spec` turns pydantic's errors into one
:class:`SpecError` whose lines are ``<field>: <problem>``. Proto ⇄ domain translation lives
in :mod:`services.autoscaler.translate`; nothing here does I/O.

YAML shape (RoleBasedGroup v1alpha2 roles plus SLO classes, P:D ratio bounds, a budget)::

    name: chat
    model: llama
    roles:
      - {name: prefill, role: prefill, replicas: 2, min_replicas: 1, max_replicas: 8,
         engine: sim, args: [--profile, test]}
      - {name: decode, role: decode, replicas: 2, min_replicas: 1, max_replicas: 8,
         dependencies: [prefill]}
    coordination: {min_pd_ratio: 0.25, max_pd_ratio: 4, max_skew_percent: 50,
                   scale_together: [prefill, decode]}
    slo_classes: [{name: interactive, ttft_ms: 1000, tpot_ms: 50, percentile: 90}]
    budget: {max_replicas: 12, group: gpu-pool, priority: 10}
    planner: {policy: sla, predictor: constant, max_utilization: 0.7}
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from services.common.perfmodel import PROFILES

__all__ = [
    "ENGINE_KINDS",
    "ROLE_KINDS",
    "BudgetSpec",
    "CoordinationSpec",
    "DeploymentSpec",
    "PlannerSpec",
    "RoleSpec",
    "SLOClassSpec",
    "SpecError",
    "load_spec_file",
    "parse_spec",
]

ROLE_KINDS = ("worker", "prefill", "decode", "kvcache")
ENGINE_KINDS = ("sim", "sglang", "vllm")
_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")

RoleKind = Literal["worker", "prefill", "decode", "kvcache"]
EngineKind = Literal["sim", "sglang", "vllm"]
RestartPolicy = Literal["always", "never"]


class SpecError(ValueError):
    """A refused spec; ``str()`` has one ``<field>: <problem>`` line per problem."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class SLOClassSpec(_Frozen):
    """Latency targets of a class of traffic at a percentile (0 = no target)."""

    name: str = Field(min_length=1)
    priority: int = 0
    ttft_ms: float = Field(default=0.0, ge=0)
    tpot_ms: float = Field(default=0.0, ge=0)
    percentile: float = Field(default=90.0, gt=0, le=100)
    max_queue_ms: float = Field(default=0.0, ge=0)


class RoleSpec(_Frozen):
    """One role: a group of identical instances (RoleBasedGroup v1alpha2 role)."""

    name: str
    role: RoleKind
    replicas: int = Field(default=1, ge=0)
    min_replicas: int = Field(default=0, ge=0)
    max_replicas: int = Field(default=1, ge=0)
    engine: EngineKind = "sim"
    args: tuple[str, ...] = ()
    template: str = ""
    image: str = ""
    resources: Mapping[str, str] = Field(default_factory=dict)
    dependencies: tuple[str, ...] = ()
    restart_policy: RestartPolicy = "always"
    """Local driver, on a crash: ``always`` restart with back-off; ``never`` leave it FAILED."""
    ports: tuple[Annotated[int, Field(ge=1, le=65535)], ...] = ()
    """Local driver: the instances' ports in launch order (beyond them: the driver's range)."""
    sidecars: tuple[str, ...] = ()
    """Local driver: command lines run beside each instance (e.g. its kv-bridge), with the
    instance's placeholders; started, restarted and stopped with it."""
    startup_timeout_s: float = Field(default=0.0, ge=0)
    """Seconds an instance gets to become ready (0 = the driver's default)."""

    @model_validator(mode="after")
    def _bounds(self) -> RoleSpec:
        if not _NAME.match(self.name):
            raise ValueError(f"name {self.name!r} is not a DNS label ([a-z0-9-], 1-63)")
        if self.min_replicas > self.max_replicas:
            raise ValueError(
                f"min_replicas ({self.min_replicas}) > max_replicas ({self.max_replicas})"
            )
        if len(set(self.ports)) != len(self.ports):
            raise ValueError(f"ports {list(self.ports)} repeat a port")
        if not self.min_replicas <= self.replicas <= self.max_replicas:
            raise ValueError(
                f"replicas ({self.replicas}) outside [min_replicas, max_replicas] "
                f"= [{self.min_replicas}, {self.max_replicas}]"
            )
        return self


class CoordinationSpec(_Frozen):
    """Rules tying roles together while scaling."""

    min_pd_ratio: float = Field(default=0.0, ge=0)
    max_pd_ratio: float = Field(default=0.0, ge=0)
    scale_together: tuple[str, ...] = ()
    drain_before_remove: bool = True
    drain_timeout_s: float = Field(default=0.0, ge=0)
    max_skew_percent: float = Field(default=0.0, ge=0, le=100)


class BudgetSpec(_Frozen):
    """Replica budget of the deployment and, with ``group``, its share of a shared one."""

    max_replicas: int = Field(default=0, ge=0)
    group: str = ""
    priority: int = 0


class PlannerSpec(_Frozen):
    """This deployment's planner settings over the autoscaler's own
    (:class:`~services.common.planner.config.PlannerConfig`); "" and 0 leave the
    autoscaler's setting."""

    policy: Literal["", "sla", "reactive"] = ""
    predictor: Literal["", "constant", "moving_average", "holt_winters"] = ""
    max_utilization: float = Field(default=0.0, ge=0, lt=1)
    decode_headroom: float = Field(default=0.0, ge=0, le=1)
    stream_interval: int = Field(default=0, ge=0)

    def overrides(self) -> dict[str, str | float | int]:
        """The settings this spec sets, as ``PlannerConfig`` field values."""
        return {k: v for k, v in self.model_dump().items() if v}


class DeploymentSpec(_Frozen):
    """A deployment: one model served by a role-based group. ``generation`` is assigned by
    the store on apply (ignored on input)."""

    name: str
    model: str = ""
    roles: tuple[RoleSpec, ...] = Field(min_length=1)
    coordination: CoordinationSpec = CoordinationSpec()
    slo_classes: tuple[SLOClassSpec, ...] = ()
    pd_protocol: Literal["", "sglang", "vllm"] = ""
    scheduler_profile: str = ""
    kv_block_size: int = Field(default=0, ge=0)
    perf_profile: str = ""
    budget: BudgetSpec = BudgetSpec()
    planner: PlannerSpec = PlannerSpec()
    generation: int = Field(default=0, ge=0)

    @model_validator(mode="after")
    def _whole(self) -> DeploymentSpec:
        problems = _problems(self)
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def role(self, name: str) -> RoleSpec:
        """The role called ``name``; KeyError otherwise."""
        for r in self.roles:
            if r.name == name:
                return r
        raise KeyError(name)

    def roles_of(self, kind: str) -> tuple[RoleSpec, ...]:
        return tuple(r for r in self.roles if r.role == kind)


def _problems(spec: DeploymentSpec) -> list[str]:
    """Cross-field problems, each naming its field."""
    out: list[str] = []
    if not _NAME.match(spec.name):
        out.append(f"name: {spec.name!r} is not a DNS label ([a-z0-9-], 1-63)")
    names = [r.name for r in spec.roles]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        out.append(f"roles: duplicate role names {dupes}")
    known = set(names)
    for i, r in enumerate(spec.roles):
        for dep in r.dependencies:
            if dep not in known:
                out.append(f"roles[{i}].dependencies: unknown role {dep!r}")
    owner: dict[int, str] = {}
    for i, r in enumerate(spec.roles):
        for port in r.ports:
            if port in owner:
                out.append(f"roles[{i}].ports: {port} is also a port of role {owner[port]!r}")
            owner.setdefault(port, r.name)
    cycle = _cycle({r.name: r.dependencies for r in spec.roles})
    if cycle:
        out.append(f"roles.dependencies: cycle {' -> '.join(cycle)}")
    for name in spec.coordination.scale_together:
        if name not in known:
            out.append(f"coordination.scale_together: unknown role {name!r}")
    out.extend(_ratio_problems(spec))
    classes = [c.name for c in spec.slo_classes]
    if len(set(classes)) != len(classes):
        out.append("slo_classes: duplicate class names")
    if spec.perf_profile and spec.perf_profile not in PROFILES:
        out.append(f"perf_profile: unknown profile {spec.perf_profile!r}; known {sorted(PROFILES)}")
    floor = sum(r.min_replicas for r in spec.roles)
    if spec.budget.max_replicas and floor > spec.budget.max_replicas:
        out.append(
            f"budget.max_replicas: {spec.budget.max_replicas} < the roles' min_replicas sum {floor}"
        )
    return out


def _ratio_problems(spec: DeploymentSpec) -> list[str]:
    c = spec.coordination
    if not (c.min_pd_ratio or c.max_pd_ratio):
        return []
    if c.max_pd_ratio and c.min_pd_ratio > c.max_pd_ratio:
        return [f"coordination.min_pd_ratio: {c.min_pd_ratio} > max_pd_ratio {c.max_pd_ratio}"]
    prefill, decode = spec.roles_of("prefill"), spec.roles_of("decode")
    if not prefill or not decode:
        return ["coordination: P:D ratio bounds need a prefill and a decode role"]
    pmin, pmax = sum(r.min_replicas for r in prefill), sum(r.max_replicas for r in prefill)
    dmin, dmax = sum(r.min_replicas for r in decode), sum(r.max_replicas for r in decode)
    reachable_hi = pmax / dmin if dmin else float("inf")
    reachable_lo = pmin / dmax if dmax else float("inf")
    out = []
    if c.min_pd_ratio and reachable_hi < c.min_pd_ratio:
        out.append(
            f"coordination.min_pd_ratio: {c.min_pd_ratio} unreachable; the roles' min/max "
            f"allow at most {reachable_hi:g} prefill per decode"
        )
    if c.max_pd_ratio and reachable_lo > c.max_pd_ratio:
        out.append(
            f"coordination.max_pd_ratio: {c.max_pd_ratio} unreachable; the roles' min/max "
            f"need at least {reachable_lo:g} prefill per decode"
        )
    return out


def _cycle(graph: Mapping[str, Sequence[str]]) -> list[str]:
    """One dependency cycle as a path ``[a, b, a]``, or [] (depth-first, colours)."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        stack.append(node)
        for nxt in graph.get(node, ()):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt in graph and nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return []

    for node in graph:
        if node not in state:
            found = visit(node)
            if found:
                return found
    return []


def _field(loc: Sequence[int | str]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def parse_spec(data: Any) -> DeploymentSpec:
    """Validate a parsed YAML/JSON document; :class:`SpecError` naming each bad field."""
    if not isinstance(data, Mapping):
        raise SpecError("spec: expected a mapping at the top level")
    try:
        return DeploymentSpec.model_validate(dict(data))
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            where = _field(err["loc"]) or "spec"
            msg = str(err["msg"]).removeprefix("Value error, ")
            lines.append(f"{where}: {msg}")
        raise SpecError("\n".join(lines)) from None


def load_spec_file(text: str) -> DeploymentSpec:
    """A spec from YAML text (a JSON document is YAML too)."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SpecError(f"spec: not valid YAML: {exc}") from None
    return parse_spec(data)
