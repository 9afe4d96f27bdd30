"""What a supervised process is and the ports it listens on (pure, no I/O)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ChildSpec", "PortClaim"]


@dataclass(frozen=True)
class PortClaim:
    """One port a child (or the embedded Redis) will listen on. ``shared``: deliberately
    listened on by several children (gateway replicas with SO_REUSEPORT); shared claims of
    the same setting and host are not a conflict with each other."""

    owner: str
    purpose: str
    host: str
    port: int
    setting: str = ""
    path: str | None = None
    shared: bool = False

    def url(self) -> str | None:
        """``http://host:port<path>`` for HTTP endpoints, else None."""
        return None if self.path is None else f"http://{self.host}:{self.port}{self.path}"

    def describe(self) -> str:
        return f"{self.owner} {self.purpose} port {self.host}:{self.port}"


@dataclass(frozen=True)
class ChildSpec:
    """One supervised process.

    Readiness: ``grpc_address`` → grpc.health.v1 Check SERVING; else ``ready_url`` → HTTP GET
    answering 2xx (e.g. a simulated engine's ``/health``); else ready as soon as it runs.
    ``ports`` are checked free before anything starts. ``kind`` orders stopping in ``down``
    (the local stack stops engines first). ``replica_of``: the group of interchangeable
    replicas this child belongs to (gateway replicas: "scheduler"; "" = none): one dying
    while another of its group runs is reported, not fatal.
    """

    name: str
    argv: tuple[str, ...]
    env: Mapping[str, str]
    log_path: Path
    grpc_address: str | None = None
    grpc_service: str = ""
    ready_url: str | None = None
    ports: tuple[PortClaim, ...] = ()
    kind: str = "service"
    replica_of: str = ""
