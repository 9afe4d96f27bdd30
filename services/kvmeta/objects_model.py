"""Value types of the object master (:mod:`services.kvmeta.objects`): errors, segment and
replica specs, persistent object rows, pending changes, and per-deployment state.

Errors are ``ObjectError`` subclasses whose ``code`` is a gRPC status name. Pure.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from services.kvmeta.allocation import FreeList

__all__ = [
    "COMPLETE",
    "PROCESSING",
    "AlreadyExistsError",
    "Changes",
    "DeploymentState",
    "FailedPreconditionError",
    "InvalidArgumentError",
    "NotFoundError",
    "ObjKey",
    "ObjectError",
    "ObjectState",
    "ReplicaConfig",
    "ReplicaInfo",
    "ResourceExhaustedError",
    "SegmentInfo",
    "SegmentSpec",
    "SegmentState",
    "capacity",
    "replica_infos",
    "require",
    "used",
]

PROCESSING = "processing"
COMPLETE = "complete"


class ObjectError(Exception):
    code = "INTERNAL"


class InvalidArgumentError(ObjectError):
    code = "INVALID_ARGUMENT"


class NotFoundError(ObjectError):
    code = "NOT_FOUND"


class FailedPreconditionError(ObjectError):
    code = "FAILED_PRECONDITION"


class AlreadyExistsError(ObjectError):
    code = "ALREADY_EXISTS"


class ResourceExhaustedError(ObjectError):
    code = "RESOURCE_EXHAUSTED"


@dataclass(frozen=True)
class SegmentSpec:
    name: str
    instance_id: str
    tier: int
    capacity_bytes: int
    transfer_address: str
    base_address: int = 0


@dataclass(frozen=True)
class SegmentInfo:
    spec: SegmentSpec
    used_bytes: int


@dataclass(frozen=True)
class ReplicaConfig:
    replica_num: int = 1
    policy: str = "free_ratio_first"
    preferred_segment: str = ""
    tier: int = 0  # 0 = any tier
    soft_pin: bool = False
    hard_pin: bool = False


@dataclass(frozen=True)
class ReplicaInfo:
    segment: str
    transfer_address: str
    tier: int
    offset: int
    size: int
    status: str


ObjKey = tuple[str, str, str]  # (deployment, tenant, key)


@dataclass
class ObjectState:
    """Persistent state of one object (``replicas`` = [(segment, offset)])."""

    deployment: str
    tenant: str
    key: str
    size: int
    status: str
    replicas: list[tuple[str, int]]
    soft_pin: bool = False
    hard_pin: bool = False
    started_at: float = 0.0
    lease_until: float = 0.0


@dataclass
class SegmentState:
    """A mounted segment and the free space in it."""

    spec: SegmentSpec
    space: FreeList


@dataclass
class DeploymentState:
    """Segments of one deployment and its committed objects, least recently used first."""

    segments: dict[str, SegmentState] = field(default_factory=dict)
    lru: OrderedDict[ObjKey, None] = field(default_factory=OrderedDict)


@dataclass
class Changes:
    """Rows to persist since the last drain (latest state wins)."""

    segments: dict[tuple[str, str], SegmentSpec | None] = field(default_factory=dict)
    objects: dict[ObjKey, ObjectState | None] = field(default_factory=dict)


def capacity(dep: DeploymentState) -> int:
    """Bytes of all segments of a deployment."""
    return sum(s.spec.capacity_bytes for s in dep.segments.values())


def used(dep: DeploymentState) -> int:
    """Bytes allocated in all segments of a deployment."""
    return sum(s.space.used for s in dep.segments.values())


def require(value: str, what: str) -> None:
    """Raises InvalidArgumentError when ``value`` is empty."""
    if not value:
        raise InvalidArgumentError(f"{what} must not be empty")


def replica_infos(dep: DeploymentState, obj: ObjectState) -> list[ReplicaInfo]:
    """The replicas of ``obj`` as the API shows them (segment address + offset)."""
    out = []
    for seg, off in obj.replicas:
        spec = dep.segments[seg].spec
        out.append(
            ReplicaInfo(
                seg,
                spec.transfer_address,
                spec.tier,
                spec.base_address + off,
                obj.size,
                obj.status,
            )
        )
    return out
