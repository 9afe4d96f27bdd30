"""What each chaos profile injects, in order."""

from __future__ import annotations

from dataclasses import dataclass

SERVICES = ("scheduler", "kvmeta", "telemetry", "autoscaler")


@dataclass(frozen=True)
class Profile:
    name: str
    faults: tuple[str, ...]
    """``kill:<service>``, ``kill-engine``, ``restart:redis``, ``restart:postgres``."""
    workers: int
    engines: int
    settle_s: float
    """Load kept on between a recovery and the next fault."""


SHORT = Profile(
    "short",
    (*(f"kill:{s}" for s in SERVICES), "kill-engine", "restart:redis", "restart:postgres"),
    workers=3,
    engines=3,
    settle_s=0.5,
)
LONG = Profile(
    "long",
    (
        *(f"kill:{s}" for s in SERVICES),
        "restart:redis",
        "restart:postgres",
        *(f"kill:{s}" for s in SERVICES),
        "kill-engine",
        "restart:redis",
        "kill:scheduler",
        "restart:postgres",
        "kill-engine",
    ),
    workers=6,
    engines=4,
    settle_s=5.0,
)
PROFILES = {p.name: p for p in (SHORT, LONG)}
