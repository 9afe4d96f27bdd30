"""gRPC servicer of ``tideserve.v1.AutoscalerService``: a thin translation layer.

Nothing is implemented yet: every RPC falls through to the generated base class, which the
runner reports as UNIMPLEMENTED. Implementations translate protobuf ⇄ pure core calls only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import grpc
from tideserve.v1 import autoscaler_pb2, autoscaler_pb2_grpc

__all__ = ["SERVICE_NAME", "AutoscalerServicer", "add_to_server"]

SERVICE_NAME: str = autoscaler_pb2.DESCRIPTOR.services_by_name["AutoscalerService"].full_name
"""Full gRPC name, ``tideserve.v1.AutoscalerService`` (health and reflection use it)."""

if TYPE_CHECKING:  # the generated grpc module is untyped; keep ``Any`` out of the class
    _Base = object
else:
    _Base = autoscaler_pb2_grpc.AutoscalerServiceServicer


class AutoscalerServicer(_Base):
    """``AutoscalerService``: deployments, instances and scaling decisions."""


def add_to_server(servicer: AutoscalerServicer, server: grpc.aio.Server) -> str:
    """Register ``servicer`` on ``server``; returns :data:`SERVICE_NAME`."""
    autoscaler_pb2_grpc.add_AutoscalerServiceServicer_to_server(servicer, server)
    return SERVICE_NAME
