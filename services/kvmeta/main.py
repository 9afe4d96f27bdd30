"""``python -m services.kvmeta``: the kvmeta service process."""

from __future__ import annotations

from collections.abc import Sequence

import grpc

from services.common.server import ServiceHooks, run_service
from services.kvmeta.servicer import KVMetaServicer, add_to_server
from services.kvmeta.settings import KVMetaSettings

__all__ = ["build", "main"]


def build(settings: KVMetaSettings) -> ServiceHooks:
    """Wire the kvmeta servicer (and, later, its cores and consumers) from ``settings``."""
    del settings  # nothing configurable yet

    def register(server: grpc.aio.Server) -> list[str]:
        return [add_to_server(KVMetaServicer(), server)]

    return ServiceHooks(register=register)


def main(argv: Sequence[str] | None = None) -> int:
    """Run until SIGTERM/SIGINT; 0 on a clean stop, 2 (one stderr line) if it cannot start."""
    return run_service(
        "kvmeta",
        KVMetaSettings,
        build,
        argv,
        description="Tideserve kvmeta: the global KV-block index, tier/object metadata and the data-plane segment registry.",
    )
