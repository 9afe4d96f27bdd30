"""Admission control (pure core): SLO-classed, tenant-fair, bounded queues and shedding."""

from services.common.admission.preempt import plan_preemptions
from services.common.admission.queue import (
    AdmissionQueue,
    Admitted,
    ClassSpec,
    InFlight,
    QueueConfig,
    QueuedRequest,
    Shed,
    choose_preemption,
    saturated,
)

__all__ = [
    "AdmissionQueue",
    "Admitted",
    "ClassSpec",
    "InFlight",
    "QueueConfig",
    "QueuedRequest",
    "Shed",
    "choose_preemption",
    "plan_preemptions",
    "saturated",
]
