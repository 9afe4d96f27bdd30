"""Agent sessions as first-class objects, and the agent-memory rules (all pure: no I/O, no
asyncio, no clock; time is passed in). kvmeta holds the table; the scheduler, telemetry and
the simulator can run the same rules.

- :mod:`.model` — :class:`Session`, its :class:`Phase`, keys and errors;
- :mod:`.table` — :class:`SessionTable`: turns start and end, placement, expiry;
- :mod:`.tooltime` — :class:`ToolTimePredictor`: gap distributions per tool and agent;
- :mod:`.gaps` — :class:`TurnGaps`: the gaps a stream of turns (request records) makes;
- :mod:`.retention` — :func:`plan_retention`: protect, offload, drop, release;
- :mod:`.prefetch` — :func:`plan_prefetch` and :func:`on_arrival`: when to bring an
  offloaded prefix back, and fetch versus recompute;
- :mod:`.homes` — :func:`rendezvous_home`: the instance the router ranks first for a session;
- :mod:`.migration` — :func:`plan_migration`: where a scaled-in instance's sessions go;
- :mod:`.rebalance` — :func:`~.rebalance.plan_rebalance`: which idle sessions leave a hot
  instance, and for where.
"""

from services.common.sessions.gaps import Observation, TurnGaps
from services.common.sessions.homes import rendezvous_home, route_key
from services.common.sessions.migration import (
    Destination,
    Fate,
    HomeKV,
    Migrant,
    MigrationPlan,
    Move,
    homes_kv,
    migrant,
    plan_migration,
)
from services.common.sessions.model import (
    InvalidSessionError,
    Phase,
    Session,
    SessionError,
    SessionKey,
    SessionNotFoundError,
    SessionsExhaustedError,
)
from services.common.sessions.prefetch import (
    Arrival,
    PrefetchPlan,
    TierLink,
    fetch_ms,
    on_arrival,
    plan_prefetch,
    recompute_ms,
)
from services.common.sessions.retention import (
    DEFAULT_BUDGET_SHARE,
    IdleSession,
    RetentionPlan,
    plan_retention,
)
from services.common.sessions.table import SessionTable
from services.common.sessions.tooltime import (
    ALL_TOOLS,
    NO_TOOL,
    GapEstimate,
    GapQuantiles,
    PriorGrid,
    ToolTimePredictor,
)

__all__ = [
    "ALL_TOOLS",
    "DEFAULT_BUDGET_SHARE",
    "NO_TOOL",
    "Arrival",
    "Destination",
    "Fate",
    "GapEstimate",
    "GapQuantiles",
    "HomeKV",
    "IdleSession",
    "InvalidSessionError",
    "Migrant",
    "MigrationPlan",
    "Move",
    "Observation",
    "Phase",
    "PrefetchPlan",
    "PriorGrid",
    "RetentionPlan",
    "Session",
    "SessionError",
    "SessionKey",
    "SessionNotFoundError",
    "SessionTable",
    "SessionsExhaustedError",
    "TierLink",
    "ToolTimePredictor",
    "TurnGaps",
    "fetch_ms",
    "homes_kv",
    "migrant",
    "on_arrival",
    "plan_migration",
    "plan_prefetch",
    "plan_retention",
    "recompute_ms",
    "rendezvous_home",
    "route_key",
]
