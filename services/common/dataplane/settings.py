"""Settings of the data plane (a frozen value; the engine builds it from its own settings).

``protocol``: ``tcp`` on one machine (loopback or a LAN), ``rdma`` in production (then
``device`` names the NICs, e.g. ``mlx5_0,mlx5_1``; empty = the Transfer Engine's own
topology discovery). ``metadata_url``: kvmeta's Mooncake metadata endpoint
(``http://HOST:8081/metadata``). ``hostname``: this engine's segment name (``host:port``,
unique among live engines: kvmeta refuses a second engine with a live name).
``transfer_timeout_s``: a batch not done by then counts as failed (the caller recomputes).
``workers``: threads that run the blocking native calls (a hung transfer holds one).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["DataPlaneSettings"]


@dataclass(frozen=True)
class DataPlaneSettings:
    hostname: str
    metadata_url: str = "http://127.0.0.1:8081/metadata"
    protocol: Literal["tcp", "rdma"] = "tcp"
    device: str = ""
    transfer_timeout_s: float = 10.0
    workers: int = 4

    def __post_init__(self) -> None:
        if self.protocol not in ("tcp", "rdma"):
            raise ValueError(f"protocol must be tcp or rdma, got {self.protocol!r}")
        if ":" not in self.hostname:
            raise ValueError(f"hostname must be host:port, got {self.hostname!r}")
        if self.transfer_timeout_s <= 0 or self.workers <= 0:
            raise ValueError("transfer_timeout_s and workers must be positive")
