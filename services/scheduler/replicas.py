"""How many gateway processes share one HTTP port on one machine (pure).

``auto`` is one per usable core, at most :data:`MAX_GATEWAYS`: one gateway process is
single-threaded and saturates one core, so the kernel's spreading of connections over one
process per core (SO_REUSEPORT) is what uses the machine. Used by ``tideserve gateway
--gateways`` and by the local stack (``tideserve up --gateways``).
"""

from __future__ import annotations

from typing import Literal

__all__ = ["MAX_GATEWAYS", "GatewayCount", "gateway_count", "parse_gateway_count"]

MAX_GATEWAYS = 16

GatewayCount = int | Literal["auto"]
"""How many gateway processes: a number, or ``auto`` (one per usable core)."""


def gateway_count(value: GatewayCount, cores: int) -> int:
    """The number of gateway processes for ``value`` on a machine with ``cores`` usable
    cores: ``auto`` is one per core, 1..``MAX_GATEWAYS``; a number is itself."""
    if value == "auto":
        return max(1, min(cores, MAX_GATEWAYS))
    return value


def parse_gateway_count(text: str) -> GatewayCount:
    """``auto`` or a whole number (for argparse ``type=``). ValueError otherwise."""
    if text.strip().lower() == "auto":
        return "auto"
    return int(text)
