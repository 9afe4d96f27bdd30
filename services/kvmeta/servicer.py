"""gRPC servicer of ``tideserve.v1.KVMetaService``: a thin translation layer.

Nothing is implemented yet: every RPC falls through to the generated base class, which the
runner reports as UNIMPLEMENTED. Implementations translate protobuf ⇄ pure core calls only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import grpc
from tideserve.v1 import kvmeta_pb2, kvmeta_pb2_grpc

__all__ = ["SERVICE_NAME", "KVMetaServicer", "add_to_server"]

SERVICE_NAME: str = kvmeta_pb2.DESCRIPTOR.services_by_name["KVMetaService"].full_name
"""Full gRPC name, ``tideserve.v1.KVMetaService`` (health and reflection use it)."""

if TYPE_CHECKING:  # the generated grpc module is untyped; keep ``Any`` out of the class
    _Base = object
else:
    _Base = kvmeta_pb2_grpc.KVMetaServiceServicer


class KVMetaServicer(_Base):
    """``KVMetaService``: the global KV-block index, tier/object metadata and the data-plane segment registry."""


def add_to_server(servicer: KVMetaServicer, server: grpc.aio.Server) -> str:
    """Register ``servicer`` on ``server``; returns :data:`SERVICE_NAME`."""
    kvmeta_pb2_grpc.add_KVMetaServiceServicer_to_server(servicer, server)
    return SERVICE_NAME
