"""Who may call what: roles, per-service access tables and the one decision (pure).

Rule: every RPC of a service is in that service's :class:`AccessTable` with the least
:class:`Role` that may call it. Roles are ordered ``read < operator < admin``: a token's role
allows every method that needs that role or less. Everything that changes state needs
``operator`` (or ``admin`` where marked); reads and routing decisions need ``read``, and are
open to callers without a token only when ``open_reads`` is set. A method in no table is
refused even with an admin token (no default-open); health checks are always open.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import grpc

__all__ = [
    "ALWAYS_OPEN",
    "AccessTable",
    "Denied",
    "Policy",
    "Role",
    "decide",
    "policy_of",
]

ALWAYS_OPEN = frozenset(
    {"/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/Watch", "/grpc.health.v1.Health/List"}
)
REFLECTION_SERVICES = (
    "grpc.reflection.v1alpha.ServerReflection",
    "grpc.reflection.v1.ServerReflection",
)


class Role(enum.IntEnum):
    """A token's role; a larger value may do everything a smaller one may."""

    READ = 1
    OPERATOR = 2
    ADMIN = 3

    @property
    def label(self) -> str:
        return {Role.READ: "read-only", Role.OPERATOR: "operator", Role.ADMIN: "admin"}[self]

    @classmethod
    def parse(cls, text: str) -> Role:
        names = {"read": cls.READ, "read-only": cls.READ, "readonly": cls.READ}
        names |= {"operator": cls.OPERATOR, "admin": cls.ADMIN}
        try:
            return names[text.strip().lower()]
        except KeyError:
            raise ValueError(f"unknown role {text!r}: read-only, operator or admin") from None


@dataclass(frozen=True)
class AccessTable:
    """One gRPC service's methods and the role each needs."""

    service: str
    """Full service name, e.g. ``tideserve.v1.KVMetaService``."""
    methods: Mapping[str, Role]
    """Method name (``MountSegment``) -> least role."""

    def paths(self) -> dict[str, Role]:
        return {f"/{self.service}/{name}": role for name, role in self.methods.items()}


Policy = Mapping[str, Role]
"""Full method path (``/tideserve.v1.KVMetaService/MountSegment``) -> least role."""


def policy_of(tables: Iterable[AccessTable], *, reflection: bool) -> dict[str, Role]:
    """The server's policy: its services' tables, plus reflection (``read``) when served."""
    out: dict[str, Role] = {}
    for table in tables:
        out.update(table.paths())
    if reflection:
        for svc in REFLECTION_SERVICES:
            out[f"/{svc}/ServerReflectionInfo"] = Role.READ
    return out


@dataclass(frozen=True)
class Denied:
    """Why a call is refused: the gRPC status and a message saying what to do."""

    code: grpc.StatusCode
    message: str


def decide(
    policy: Policy,
    method: str,
    role: Role | None,
    *,
    token_given: bool,
    open_reads: bool,
    who: str = "",
) -> Denied | None:
    """None when ``role`` (the caller's token's role; None = no valid token) may call
    ``method``, else why not. ``token_given``: a token was sent (it did not match)."""
    if method in ALWAYS_OPEN:
        return None
    needed = policy.get(method)
    if needed is None:
        return Denied(
            grpc.StatusCode.PERMISSION_DENIED,
            f"{method} is in no access table of this server: refused to every caller",
        )
    if needed is Role.READ and open_reads:
        return None
    if role is None:
        why = "the token sent is not known" if token_given else "no token was sent"
        return Denied(
            grpc.StatusCode.UNAUTHENTICATED,
            f"{method} needs a {needed.label} token ({why}; send 'authorization: Bearer TOKEN')",
        )
    if role < needed:
        return Denied(
            grpc.StatusCode.PERMISSION_DENIED,
            f"{method} needs role {needed.label}; token {who!r} has role {role.label}",
        )
    return None
