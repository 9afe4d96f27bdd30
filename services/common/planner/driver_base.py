"""The driver seam: frozen domain types and the one :class:`Driver` protocol every driver
(``local``, ``kubernetes``, ``dry-run``) implements.

A driver owns *instances* of deployment roles on some substrate (local processes, pods) and
knows nothing of planners or membership streams. The reconciler tells it how many replicas a
role should have (:meth:`Driver.scale`, level-triggered and idempotent) and reads back what
exists (:meth:`Driver.instances`). State changes are pushed to one listener
(:data:`Listener`), which the reconciler turns into ``MembershipEvent`` entries.

Contract of :meth:`Driver.scale` (every driver):

- ``replicas`` counts STARTING, READY and FAILED instances (:func:`counted`): a FAILED one is
  being restarted with back-off, so replacing it would only cascade. DRAINING and STOPPED
  ones do not count.
- Calling it again with the same arguments changes nothing (idempotent); calling it with a
  new count while an earlier call still drains is allowed and wins.
- Scale-out returns once the new instances are *launched* (STARTING), never waiting for
  readiness; the listener hears READY later.
- Scale-in removes ``victims`` first (ids the caller chose, e.g. the ones whose loss costs
  least), then the driver's own choice; every removal drains first: DRAINING is announced,
  the scheduler's ``Drain`` is called and the driver waits (bounded by the drain timeout)
  until nothing is in flight on the instance, and only then stops it. ``scale`` returns when
  the victims are gone.
- It raises :class:`DriverError` (a clear one-line message) when the change cannot be made
  now: a process that cannot be exec'd, an API error, an unknown role. Nothing it did before
  the error is undone; :meth:`instances` shows what exists. Callers retry with back-off.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

__all__ = [
    "DeploymentTarget",
    "Driver",
    "DriverError",
    "InstanceState",
    "InstanceStatus",
    "Listener",
    "RestartPolicy",
    "Role",
    "RoleTarget",
    "backoff_s",
    "choose_victims",
    "counted",
]


RestartPolicy = Literal["always", "never"]
"""What the local driver does with a crashed instance (see :class:`RoleTarget`)."""


class Role(enum.StrEnum):
    """What an instance does (``tideserve.v1.Role`` without UNSPECIFIED)."""

    WORKER = "worker"
    PREFILL = "prefill"
    DECODE = "decode"
    KVCACHE = "kvcache"


class InstanceState(enum.StrEnum):
    """Lifecycle of one instance (``tideserve.v1.InstanceState``)."""

    STARTING = "starting"
    READY = "ready"
    DRAINING = "draining"
    FAILED = "failed"
    STOPPED = "stopped"


COUNTED_STATES = frozenset({InstanceState.STARTING, InstanceState.READY, InstanceState.FAILED})
"""States that count towards a role's replicas: launched and not on the way out. FAILED
counts: the driver restarts it with back-off (a replacement would only cascade)."""

_REMOVE_FIRST = {InstanceState.FAILED: 0, InstanceState.STARTING: 1, InstanceState.READY: 2}


@dataclass(frozen=True)
class RoleTarget:
    """One role of a deployment as a driver needs it.

    ``command``: the engine command line; ``{port}``, ``{host}``, ``{instance_id}``,
    ``{role}`` and ``{deployment}`` in any word are substituted (``python -m
    sglang.launch_server --port {port} ...``). Empty: the tideserve engine simulator with
    ``args`` appended. ``image``/``resources`` matter to the kubernetes driver only;
    ``readiness_path`` is probed over HTTP (2xx = ready); an instance not ready within
    ``startup_timeout_s`` is stopped and counted as a failed start. ``dependencies``: roles
    that must have their replicas ready before this one scales out (and that scale in only
    after it). ``restart`` (local driver): ``always`` restarts a crashed instance with
    back-off, ``never`` leaves it FAILED; a FAILED instance counts towards ``replicas``
    either way, so it is not replaced. ``ports`` (local driver): ports of the role's
    instances in launch order, before the driver's range. ``drain_timeout_s``: the longest
    wait for in-flight requests before one of its instances is removed anyway (the spec's
    ``coordination.drain_timeout_s``; 0 = the driver's setting). ``sidecars`` (local
    driver): command lines run beside each instance, with the same placeholders plus
    ``{state_dir}`` (a directory of the instance's own)."""

    deployment: str
    name: str
    role: Role
    replicas: int
    engine_kind: str = "sim"
    command: tuple[str, ...] = ()
    args: tuple[str, ...] = ()
    image: str = ""
    resources: Mapping[str, str] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    readiness_path: str = "/health"
    startup_timeout_s: float = 120.0
    dependencies: tuple[str, ...] = ()
    restart: RestartPolicy = "always"
    ports: tuple[int, ...] = ()
    drain_timeout_s: float = 0.0
    sidecars: tuple[tuple[str, ...], ...] = ()

    @property
    def drain_limit_s(self) -> float | None:
        """The longest drain of one of its instances: the spec's ``drain_timeout_s``, None
        (0) = the driver's ``drain_timeout_s`` setting."""
        return self.drain_timeout_s if self.drain_timeout_s > 0 else None


@dataclass(frozen=True)
class DeploymentTarget:
    """What a deployment should look like: its roles and how they move together.
    ``max_skew``: the largest allowed difference, as a fraction of each role's target, in
    scaling progress between roles while scaling out (RoleBasedGroup's CoordinatedPolicy
    ``maxSkew``; 1.0 = uncoordinated). ``reason`` is carried into membership events."""

    name: str
    roles: tuple[RoleTarget, ...]
    max_skew: float = 1.0
    reason: str = ""

    def role(self, name: str) -> RoleTarget | None:
        return next((r for r in self.roles if r.name == name), None)


@dataclass(frozen=True)
class InstanceStatus:
    """One instance as its driver sees it. Times are epoch milliseconds from the driver's
    wall clock; ``ready_ms`` 0 until it became ready, so ``startup_ms`` (start to ready,
    what the planner's lead time uses) is 0 until then. ``restarts`` counts crashes the
    driver restarted it after; ``last_error`` the latest failure, "" if none."""

    instance_id: str
    deployment: str
    role_name: str
    role: Role
    state: InstanceState
    endpoint: str = ""
    started_ms: int = 0
    ready_ms: int = 0
    restarts: int = 0
    last_error: str = ""
    engine_kind: str = "sim"

    @property
    def startup_ms(self) -> int:
        return self.ready_ms - self.started_ms if self.ready_ms else 0


def backoff_s(failures: int, base_s: float, cap_s: float) -> float:
    """Exponential back-off after ``failures`` consecutive failures (0 = no wait):
    ``base_s``, 2x, 4x, ... capped at ``cap_s``."""
    if failures <= 0:
        return 0.0
    return float(min(cap_s, base_s * 2.0 ** min(failures - 1, 30)))


def counted(instances: Sequence[InstanceStatus], role_name: str) -> list[InstanceStatus]:
    """The instances of ``role_name`` that count towards its replicas (:data:`COUNTED_STATES`)."""
    return [i for i in instances if i.role_name == role_name and i.state in COUNTED_STATES]


def choose_victims(
    candidates: Sequence[InstanceStatus], n: int, preferred: Sequence[str] = ()
) -> list[str]:
    """``n`` instance ids to remove from ``candidates`` (pure): the caller's ``preferred``
    ones first (in its order, unknown ids skipped), then those that serve nothing yet
    (FAILED, then STARTING), then READY ones, the most recently started first (the least
    warm cache)."""
    if n <= 0:
        return []
    known = {c.instance_id: c for c in candidates}
    out = [v for v in dict.fromkeys(preferred) if v in known][:n]
    rest = sorted(
        (c for c in candidates if c.instance_id not in out),
        key=lambda c: (_REMOVE_FIRST.get(c.state, 3), -c.started_ms, c.instance_id),
    )
    return out + [c.instance_id for c in rest[: n - len(out)]]


class DriverError(Exception):
    """A change the driver could not make now (message: one line naming what and why)."""


Listener = Callable[[InstanceStatus, str], Awaitable[None]]
"""Called with an instance's new status and a reason after every state change."""


@runtime_checkable
class Driver(Protocol):
    """One protocol for every driver; see the module docstring for the contract."""

    name: str

    def set_listener(self, listener: Listener) -> None:
        """Where state changes go (one listener; the reconciler)."""

    async def start(self) -> None:
        """Start background work (supervision, pod watch). Idempotent."""

    async def scale(self, role: RoleTarget, replicas: int, victims: Sequence[str] = ()) -> None:
        """Bring ``role`` to ``replicas`` live instances; see the module docstring."""

    def instances(self, deployment: str) -> Sequence[InstanceStatus]:
        """Every instance of ``deployment`` the driver knows, stopped ones excluded."""

    async def close(self) -> None:
        """Stop background work. Instances are left as they are unless the driver owns
        them as processes (``local`` stops them, without draining). Idempotent."""
