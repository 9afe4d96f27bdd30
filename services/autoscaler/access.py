"""Who may call ``tideserve.v1.AutoscalerService`` (services.common.security.access):
apply and scale need ``operator``, deleting a deployment ``admin``; gets, lists and the
dry-run ``Plan`` need ``read``."""

from __future__ import annotations

from services.common.security.access import AccessTable, Role

__all__ = ["ACCESS"]

ACCESS = AccessTable(
    "tideserve.v1.AutoscalerService",
    {
        "ApplyDeployment": Role.OPERATOR,
        "GetDeployment": Role.READ,
        "ListDeployments": Role.READ,
        "DeleteDeployment": Role.ADMIN,
        "ListInstances": Role.READ,
        "Plan": Role.READ,
        "ScaleRole": Role.OPERATOR,
        "ListDecisions": Role.READ,
    },
)
