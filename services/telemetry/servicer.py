"""gRPC servicer of ``tideserve.v1.TelemetryService``: a thin translation layer.

Nothing is implemented yet: every RPC falls through to the generated base class, which the
runner reports as UNIMPLEMENTED. Implementations translate protobuf ⇄ pure core calls only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import grpc
from tideserve.v1 import telemetry_pb2, telemetry_pb2_grpc

__all__ = ["SERVICE_NAME", "TelemetryServicer", "add_to_server"]

SERVICE_NAME: str = telemetry_pb2.DESCRIPTOR.services_by_name["TelemetryService"].full_name
"""Full gRPC name, ``tideserve.v1.TelemetryService`` (health and reflection use it)."""

if TYPE_CHECKING:  # the generated grpc module is untyped; keep ``Any`` out of the class
    _Base = object
else:
    _Base = telemetry_pb2_grpc.TelemetryServiceServicer


class TelemetryServicer(_Base):
    """``TelemetryService``: per-request records, windows, the performance model and recommendations."""


def add_to_server(servicer: TelemetryServicer, server: grpc.aio.Server) -> str:
    """Register ``servicer`` on ``server``; returns :data:`SERVICE_NAME`."""
    telemetry_pb2_grpc.add_TelemetryServiceServicer_to_server(servicer, server)
    return SERVICE_NAME
