"""What each chaos profile injects, in order."""

from __future__ import annotations

from dataclasses import dataclass

SERVICES = ("scheduler", "kvmeta", "telemetry", "autoscaler")


@dataclass(frozen=True)
class Profile:
    name: str
    faults: tuple[str, ...]
    """``kill:<service>`` (kill -9; ``up`` restarts it), ``kill-engine`` (it stays dead),
    ``down:redis`` (stopped while the load must go on, then started again),
    ``down:postgres`` (hung: every postgres process SIGSTOPped while the load must go on,
    then resumed and restarted), ``hang:<service>`` or ``hang:redis`` (SIGSTOPped while the
    load must go on, then resumed), ``cut:gateway`` (the second gateway replica's
    connections to Redis reset and refused while the load must go on, then healed): the
    last four are the degraded modes."""
    workers: int
    engines: int
    settle_s: float
    """Load kept on between a recovery and the next fault."""
    down_s: float
    """How long a degraded mode lasts at least (and until requests sent after it began
    have completed)."""
    timeout_s: float
    """The whole test's time limit (pytest-timeout)."""


DEGRADED = ("hang:kvmeta", "hang:telemetry", "cut:gateway", "down:redis", "down:postgres")
SHORT = Profile(
    "short",
    (*(f"kill:{s}" for s in SERVICES), "kill-engine", *DEGRADED),
    workers=2,
    engines=2,
    settle_s=0.5,
    down_s=2.0,
    timeout_s=900.0,
)
LONG = Profile(
    "long",
    (
        *(f"kill:{s}" for s in SERVICES),
        *DEGRADED,
        *(f"kill:{s}" for s in SERVICES),
        "kill-engine",
        "down:redis",
        "kill:scheduler",
        "down:postgres",
        "kill-engine",
        "hang:autoscaler",
        "hang:redis",
    ),
    workers=6,
    engines=4,
    settle_s=5.0,
    down_s=20.0,
    timeout_s=3600.0,
)
PROFILES = {p.name: p for p in (SHORT, LONG)}
