"""SLO classes and tenants from settings (pure: no I/O, no clock).

Settings shape (``tideserve.yaml``, ``scheduler:`` section, or ``TIDESERVE_SCHEDULER__*``)::

    scheduler:
      slo_classes:                  # default: interactive, agent, batch (below)
        - {name: interactive, priority: 30, ttft_ms: 2000, max_queue_ms: 5000}
        - {name: agent, priority: 20, ttft_ms: 10000, max_queue_ms: 30000, starve_after_ms: 10000}
        - {name: batch, priority: 10, ttft_ms: 0, max_queue_ms: 300000, starve_after_ms: 60000}
      default_slo_class: agent      # requests that name no class
      tenants: {acme: 2.0, beta: 1.0}   # name -> fair-share weight; {} = any tenant, weight 1
      queue_max_total: 50000        # queued requests across classes

A class has ``name``, ``priority`` (higher first, strict between classes), ``ttft_ms`` and
``tpot_ms`` targets (0 = none; the TTFT target is the request's budget for the SLO-aware
plugins), ``max_queue_ms`` (longest wait in the admission queue, then 429), ``max_queued``
(bound of the class's queue, then 429) and ``starve_after_ms`` (promotion; 0 = never).

How a request names them (header first, then body field; the body fields are removed
before the request is forwarded to the engine):

| what | header | body field |
|---|---|---|
| SLO class | ``X-Tideserve-Class`` | ``slo_class`` |
| tenant | ``X-Tideserve-Tenant`` | ``tenant`` |
| session / agent id (affinity) | ``X-Tideserve-Session`` | ``session_id`` |
| TTFT deadline, ms from now | ``X-Tideserve-Deadline-Ms`` | — |
| scheduler profile | ``X-Tideserve-Profile`` | — |

An unknown class, or — when ``tenants`` is configured — an unknown or missing tenant, gets
HTTP 400 with an OpenAI-style error (``param`` ``slo_class`` / ``tenant``), counted in
``tideserve_gateway_bad_requests_total``, never forwarded. gRPC ``Pick`` answers NOT_FOUND
for an unknown class.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field

from services.common.admission import ClassSpec, QueueConfig
from services.common.scheduling.service import SLOTargets

__all__ = [
    "DEFAULT_SLO_CLASSES",
    "SLOClassConfig",
    "known_tenants",
    "queue_config",
    "slo_targets",
]


class SLOClassConfig(BaseModel):
    """One SLO class as written in settings."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1, max_length=64)
    priority: int
    ttft_ms: float = Field(default=0.0, ge=0.0, description="TTFT target; 0 = none")
    tpot_ms: float = Field(default=0.0, ge=0.0, description="TPOT target; 0 = none")
    max_queue_ms: float = Field(default=30_000.0, gt=0.0, description="longest wait in the queue")
    max_queued: int = Field(default=10_000, ge=1, description="queue bound of this class")
    starve_after_ms: float = Field(default=0.0, ge=0.0, description="promotion after; 0 = never")


DEFAULT_SLO_CLASSES: tuple[SLOClassConfig, ...] = (
    SLOClassConfig(name="interactive", priority=30, ttft_ms=2_000.0, max_queue_ms=5_000.0),
    SLOClassConfig(
        name="agent", priority=20, ttft_ms=10_000.0, max_queue_ms=30_000.0, starve_after_ms=10_000.0
    ),
    SLOClassConfig(
        name="batch", priority=10, ttft_ms=0.0, max_queue_ms=300_000.0, starve_after_ms=60_000.0
    ),
)


def queue_config(
    classes: Sequence[SLOClassConfig],
    *,
    default_class: str,
    tenants: Mapping[str, float] | None = None,
    max_total: int = 50_000,
) -> QueueConfig:
    """The admission queue's config. ValueError (one line) for duplicate or missing class
    names, a default class that is not one of them, a tenant weight <= 0 or a bound < 1."""
    if max_total < 1:
        raise ValueError(f"queue_max_total must be >= 1, got {max_total}")
    specs = tuple(
        ClassSpec(
            c.name,
            c.priority,
            max_queue_ms=c.max_queue_ms,
            max_queued=c.max_queued,
            starve_after_ms=c.starve_after_ms,
        )
        for c in classes
    )
    return QueueConfig(
        classes=specs,
        default_class=default_class,
        tenant_weights=dict(tenants or {}),
        max_total=max_total,
    )


def slo_targets(classes: Sequence[SLOClassConfig]) -> SLOTargets:
    """Per-class TTFT/TPOT targets for the core (0 = none)."""
    return SLOTargets(
        ttft_ms={c.name: c.ttft_ms for c in classes},
        tpot_ms={c.name: c.tpot_ms for c in classes},
    )


def known_tenants(tenants: Mapping[str, float]) -> frozenset[str] | None:
    """The tenants a request may name: None (any) when none are configured."""
    return frozenset(tenants) if tenants else None
