"""Who may call ``tideserve.v1.SchedulerService`` (services.common.security.access): drain
and undrain need ``operator``; the decision RPCs (``Pick``, ``PickStream`` and the
``ReportOutcome`` that settles a pick) and ``ListEndpoints`` need ``read``, the role a
platform picker is given."""

from __future__ import annotations

from services.common.security.access import AccessTable, Role

__all__ = ["ACCESS"]

ACCESS = AccessTable(
    "tideserve.v1.SchedulerService",
    {
        "Pick": Role.READ,
        "PickStream": Role.READ,
        "ReportOutcome": Role.READ,
        "ListEndpoints": Role.READ,
        "Drain": Role.OPERATOR,
        "Undrain": Role.OPERATOR,
    },
)
