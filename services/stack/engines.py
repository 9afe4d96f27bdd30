"""Simulated engines in the local stack: which to start, on which ports, and how the
scheduler learns about them. Pure: no I/O.

``tideserve up --engines N`` plans N aggregated engines; ``--prefill P --decode D`` plans a
disaggregated fleet (both or neither); with neither, :func:`default_workers` engines
(:data:`DEFAULT_ENGINES`, as ``make run``, unless the scheduler has static ``endpoints`` of
its own); ``--engines 0`` starts none. The engines run on ports from the base port upward (30001 + offset by
default, or explicit ports). The engines are a deployment of the stack's autoscaler (see
:mod:`services.stack.deployment`), which runs them with its local driver; the scheduler
learns them from membership (``ListInstances`` seed + ``{prefix}:membership``), its static
``endpoints`` emptied, so its gateway routes to exactly these engines. Their Redis comes from
the stack through the autoscaler's environment (:data:`ENGINE_REDIS_ENV`).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from services.common.local.spec import ChildSpec
from services.common.tokens.hashing import DEFAULT_BLOCK_SIZE

__all__ = [
    "DEFAULT_ENGINES",
    "DEFAULT_ENGINE_BASE_PORT",
    "ENGINE_KIND",
    "ENGINE_REDIS_ENV",
    "MAX_ENGINES",
    "EngineFleet",
    "EnginePlan",
    "RealEngine",
    "default_workers",
    "plan_engines",
    "scheduler_engine_env",
    "split_engine_args",
    "start_waves",
    "stop_rank",
    "wire_scheduler",
]

DEFAULT_ENGINE_BASE_PORT = 30001
DEFAULT_ENGINES = 2
"""Aggregated engines ``tideserve up`` starts when nothing says how many (as ``make run``):
a gateway with no engine could only answer 503."""
ENGINE_KIND = "engine"
ENGINE_REDIS_ENV = "TIDESERVE_ENGINE_REDIS_URL"
"""The engine reads its Redis URL from here (the URL is known only once Redis runs)."""

MAX_ENGINES = 256

_NAME_PREFIX = {"aggregated": "engine", "prefill": "prefill", "decode": "decode"}
_RESERVED_FLAGS = (
    "--host",
    "--port",
    "--instance-id",
    "--role",
    "--redis-url",
    "--deployment",
    "--block-size",
    "--state-dir",
    "--profile",
    "--bootstrap-port",
)
"""Flags the stack manages; ``--engine-arg`` may not set them. (No dedicated bootstrap port:
the gateway sends SGLang bootstrap requests to a prefill engine's HTTP port, where the
simulator serves ``/bootstrap/{room}`` too.)"""


@dataclass(frozen=True)
class RealEngine:
    """A real engine kind serving one model directory. ``command``: the server's command
    words (empty: the kind's default,
    :data:`services.stack.real_engines.DEFAULT_COMMANDS`); ``python``: the interpreter that runs the
    sidecar bridges (the stack's own)."""

    kind: str
    model_path: str
    model_name: str = ""
    command: tuple[str, ...] = ()
    startup_timeout_s: float = 600.0
    python: str = "python3"

    @property
    def served_name(self) -> str:
        return self.model_name or Path(self.model_path).name


@dataclass(frozen=True)
class EngineFleet:
    """What the user asked for. ``workers``: aggregated engines; ``prefill``/``decode``:
    a disaggregated pair of pools. ``ports`` (explicit, in start order) win over
    ``base_port`` (already shifted by any offset). ``profile``/``speedup``/``kv_blocks``
    None leave the engine's own default. ``extra_args`` go to every engine verbatim.
    ``te_metadata_url``: kvmeta's Transfer Engine metadata endpoint; with it a P/D fleet
    moves real KV bytes in its hand-off (``--kv-data-plane``). ``real``: the aggregated
    engines are real vLLM or SGLang servers of a model (:mod:`services.stack.real_engines`),
    not simulators; ``stream_prefix``: the stack's, where their bridges publish."""

    workers: int = 0
    prefill: int = 0
    decode: int = 0
    base_port: int = DEFAULT_ENGINE_BASE_PORT
    ports: tuple[int, ...] = ()
    profile: str | None = None
    speedup: float | None = None
    kv_blocks: int | None = None
    block_size: int = DEFAULT_BLOCK_SIZE
    deployment: str = "default"
    extra_args: tuple[str, ...] = ()
    te_metadata_url: str | None = None
    real: RealEngine | None = None
    stream_prefix: str = "ts"

    @property
    def total(self) -> int:
        return self.workers + self.prefill + self.decode

    @property
    def data_plane(self) -> bool:
        """The engines move real KV bytes: a P/D fleet with kvmeta's metadata endpoint."""
        return self.prefill > 0 and self.te_metadata_url is not None


@dataclass(frozen=True)
class EnginePlan:
    """One engine to start: stack name, simulator role, port."""

    name: str
    role: str
    port: int

    def url(self, host: str) -> str:
        return f"http://{host}:{self.port}"


def split_engine_args(
    values: Sequence[str], reserved: Sequence[str] = _RESERVED_FLAGS, engine: str = "sim"
) -> tuple[str, ...]:
    """``--engine-arg`` values (each shell-split: ``"--max-batch 64"`` is two words) as one
    argument list. ValueError when one sets a flag the stack owns (``reserved``, those of
    the simulator by default; ``engine`` names the kind in the message)."""
    out: list[str] = []
    for value in values:
        out.extend(shlex.split(value))
    for word in out:
        flag = word.split("=", 1)[0]
        if flag in reserved:
            how = "--model-path, " if engine != "sim" else "--engine-profile, "
            raise ValueError(
                f"--engine-arg {flag}: managed by the stack for --engine {engine} "
                f"(use {how}--base-port-offset, or the scheduler's block_size)"
            )
    return tuple(out)


def plan_engines(fleet: EngineFleet) -> tuple[EnginePlan, ...]:
    """Names, roles and ports in start order: aggregated, then prefill, then decode.

    Raises ValueError (one line) for negative counts, prefill without decode (or the reverse),
    too many engines, too few explicit ports, or a port out of range.
    """
    for what, n in (
        ("engines", fleet.workers),
        ("prefill", fleet.prefill),
        ("decode", fleet.decode),
    ):
        if n < 0:
            raise ValueError(f"--{what} {n}: must be 0 or more")
    if (fleet.prefill > 0) != (fleet.decode > 0):
        raise ValueError(
            f"--prefill {fleet.prefill} --decode {fleet.decode}: "
            "disaggregated serving needs at least one of each"
        )
    if fleet.total > MAX_ENGINES:
        raise ValueError(f"{fleet.total} engines: at most {MAX_ENGINES} in a local stack")
    if fleet.ports and len(fleet.ports) < fleet.total:
        raise ValueError(
            f"stack.engine_ports lists {len(fleet.ports)} ports for {fleet.total} engines"
        )
    roles = (
        [("aggregated", i) for i in range(fleet.workers)]
        + [("prefill", i) for i in range(fleet.prefill)]
        + [("decode", i) for i in range(fleet.decode)]
    )
    out = []
    for k, (role, i) in enumerate(roles):
        port = fleet.ports[k] if fleet.ports else fleet.base_port + k
        if not 1 <= port <= 65535:
            raise ValueError(f"engine port {port} is outside 1..65535 (stack.engine_base_port)")
        out.append(EnginePlan(f"{_NAME_PREFIX[role]}-{i + 1}", role, port))
    return tuple(out)


def scheduler_engine_env(
    fleet: EngineFleet, *, autoscaler_address: str, perf_profile: str | None
) -> dict[str, str]:
    """The scheduler's environment additions for ``fleet``: no static ``endpoints`` (the
    engines come from membership), the ``autoscaler_address`` whose ``ListInstances`` seeds
    them, ``deployment``, ``block_size`` and, when given, ``perf_profile``. Empty when the
    stack runs no engines (the scheduler's own settings then apply)."""
    if not plan_engines(fleet):
        return {}
    env = {
        "TIDESERVE_SCHEDULER__ENDPOINTS": "[]",
        "TIDESERVE_SCHEDULER__AUTOSCALER_ADDRESS": autoscaler_address,
        "TIDESERVE_SCHEDULER__DEPLOYMENT": fleet.deployment,
        "TIDESERVE_SCHEDULER__BLOCK_SIZE": str(fleet.block_size),
    }
    if perf_profile:
        env["TIDESERVE_SCHEDULER__PERF_PROFILE"] = perf_profile
    return env


def wire_scheduler(
    children: Sequence[ChildSpec], extra_env: Mapping[str, str], scheduler: str = "scheduler"
) -> tuple[ChildSpec, ...]:
    """``children`` with ``extra_env`` merged into the environment of the scheduler child
    (every one of its replicas with ``--gateways N``)."""
    return tuple(
        replace(c, env={**c.env, **extra_env})
        if extra_env and scheduler in (c.name, c.replica_of)
        else c
        for c in children
    )


def stop_rank(kind: str) -> int:
    """Stop order of a child kind: engines first, then everything else (the reverse of the
    start order, see :func:`start_waves`)."""
    return 0 if kind == ENGINE_KIND else 1


def start_waves(children: Sequence[ChildSpec]) -> list[list[ChildSpec]]:
    """Children grouped for start-up: engines first (each wave must be ready before the next
    starts), then the rest, each in the given order. Empty waves are left out."""
    engines = [c for c in children if c.kind == ENGINE_KIND]
    rest = [c for c in children if c.kind != ENGINE_KIND]
    return [w for w in (engines, rest) if w]


def default_workers(engines: int | None, prefill: int, decode: int, static_endpoints: bool) -> int:
    """How many aggregated engines to start: ``engines`` when given (0 = none), else none
    for a P/D fleet (``prefill``/``decode``) or a scheduler with ``static_endpoints`` of its
    own (it routes to those), else :data:`DEFAULT_ENGINES`."""
    if engines is not None:
        return engines
    if prefill or decode or static_endpoints:
        return 0
    return DEFAULT_ENGINES
