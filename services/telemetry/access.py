"""Who may call ``tideserve.v1.TelemetryService`` (services.common.security.access):
reporting records needs ``operator``; window, model, recommendation, session and tool-time
queries need ``read``."""

from __future__ import annotations

from services.common.security.access import AccessTable, Role

__all__ = ["ACCESS"]

ACCESS = AccessTable(
    "tideserve.v1.TelemetryService",
    {
        "ReportRecords": Role.OPERATOR,
        "QueryWindow": Role.READ,
        "GetPerfModel": Role.READ,
        "GetRecommendation": Role.READ,
        "GetSession": Role.READ,
        "GetToolTimes": Role.READ,
    },
)
