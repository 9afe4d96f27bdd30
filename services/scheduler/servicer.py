"""gRPC servicer of ``tideserve.v1.SchedulerService``: a thin translation layer.

Nothing is implemented yet: every RPC falls through to the generated base class, which the
runner reports as UNIMPLEMENTED. Implementations translate protobuf ⇄ pure core calls only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import grpc
from tideserve.v1 import scheduler_pb2, scheduler_pb2_grpc

__all__ = ["SERVICE_NAME", "SchedulerServicer", "add_to_server"]

SERVICE_NAME: str = scheduler_pb2.DESCRIPTOR.services_by_name["SchedulerService"].full_name
"""Full gRPC name, ``tideserve.v1.SchedulerService`` (health and reflection use it)."""

if TYPE_CHECKING:  # the generated grpc module is untyped; keep ``Any`` out of the class
    _Base = object
else:
    _Base = scheduler_pb2_grpc.SchedulerServiceServicer


class SchedulerServicer(_Base):
    """``SchedulerService``: request admission, queues, routing decisions and the OpenAI-compatible gateway."""


def add_to_server(servicer: SchedulerServicer, server: grpc.aio.Server) -> str:
    """Register ``servicer`` on ``server``; returns :data:`SERVICE_NAME`."""
    scheduler_pb2_grpc.add_SchedulerServiceServicer_to_server(servicer, server)
    return SERVICE_NAME
