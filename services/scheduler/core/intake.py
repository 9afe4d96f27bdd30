"""Request intake (pure): what the HTTP gateway and the gRPC ``Pick`` share before routing.

Both shells translate their request into an :class:`Intake`; from there the steps are the
same code: :func:`check_names` (a known profile, SLO class and, when tenants are
configured, tenant), :func:`request_view` (the routing view: block hashes, TTFT budget),
:func:`queued` (what the admission queue needs) and :func:`admit_at_once` (the fast path:
nothing queued and a free slot). The asynchronous step (the prefix lookup and the wait in
the admission queue) is :class:`services.scheduler.admission.gate.AdmissionGate`.

Refusals are :class:`Refused`; each shell maps its ``kind`` to its own status (HTTP
400/429/503, gRPC NOT_FOUND/RESOURCE_EXHAUSTED/UNAVAILABLE).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from services.common.admission import QueuedRequest
from services.common.routing.types import RequestView
from services.common.scheduling.service import GatewayCore

__all__ = [
    "Intake",
    "Refused",
    "admit_at_once",
    "check_names",
    "queued",
    "request_view",
]

RefusalKind = Literal["unknown", "overloaded", "unavailable"]


class Refused(Exception):
    """``unknown``: a name the scheduler does not know (``param`` names the field);
    ``overloaded``: shed, with a retry hint; ``where`` is admission (queue full / deadline),
    queue_timeout or routing (the SLO filter); ``unavailable``: no engine can serve it
    (none registered, or none healthy, undrained and closed-circuit)."""

    def __init__(
        self,
        kind: RefusalKind,
        message: str,
        *,
        param: str = "",
        retry_after_ms: int = 0,
        where: str = "admission",
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.param = param
        self.retry_after_ms = retry_after_ms
        self.where = where


@dataclass(frozen=True, slots=True)
class Intake:
    """One request as the shells hand it over. ``deadline_in_ms``: time left at arrival;
    ``index_tenant``: the namespace the KV index holds its blocks under (the token path's
    :meth:`~services.common.tokens.TokenPath.index_tenant` of its ``cache_salt``)."""

    request_id: str
    prompt_tokens: int
    block_hashes: tuple[int, ...]
    max_tokens: int = 0
    tenant: str = ""
    slo_class: str = ""
    session_id: str = ""
    parent_session_id: str = ""
    profile: str = ""
    index_tenant: str = ""
    deadline_in_ms: float | None = None
    exclude: frozenset[str] = frozenset()
    # The session ends with this turn: what routing keeps for it is dropped once answered.
    session_final: bool = False


def check_names(core: GatewayCore, profile: str, slo_class: str, tenant: str) -> None:
    """Refused (``unknown``) for a profile, SLO class or tenant the core does not know
    (any tenant is known when none are configured)."""
    if profile and profile not in core.scheduler.profiles:
        raise Refused("unknown", f"unknown scheduler profile {profile!r}", param="profile")
    config = core.queue.config
    if slo_class and all(c.name != slo_class for c in config.classes):
        raise Refused("unknown", f"unknown SLO class {slo_class!r}", param="slo_class")
    if config.tenant_weights and tenant not in config.tenant_weights:
        raise Refused("unknown", f"unknown tenant {tenant!r}", param="tenant")


def request_view(core: GatewayCore, intake: Intake, block_size: int) -> RequestView:
    """The routing view of ``intake`` (its TTFT budget: class target and deadline)."""
    return RequestView(
        request_id=intake.request_id,
        prompt_tokens=intake.prompt_tokens,
        block_hashes=intake.block_hashes,
        block_size=block_size,
        max_tokens=intake.max_tokens,
        tenant=intake.tenant,
        slo_class=intake.slo_class,
        session_id=intake.session_id,
        parent_session_id=intake.parent_session_id,
        ttft_slo_ms=core.ttft_budget_ms(intake.slo_class, intake.deadline_in_ms),
        tpot_slo_ms=core.tpot_target_ms(intake.slo_class),
        exclude=intake.exclude,
    )


def queued(intake: Intake, arrival: float) -> QueuedRequest:
    """The admission queue's entry for ``intake`` (cost: prompt tokens)."""
    d = intake.deadline_in_ms
    deadline = arrival + d / 1000.0 if d else None
    return QueuedRequest(
        intake.request_id, intake.tenant, intake.slo_class, intake.prompt_tokens, deadline
    )


def admit_at_once(core: GatewayCore, now: float, released: int) -> bool:
    """The fast path: nothing is queued and a slot is free beyond the ``released`` requests
    that left the queue and have not picked yet."""
    return not len(core.queue) and core.capacity(now) - released > 0
