"""An explicit scale-in in the simulation (``SimConfig.scale_in_at_s``): at a chosen modelled
time, without the planner, ``scale_in_count`` engines leave by the product's path.

1. **Victims** by the autoscaler's rule (:func:`~services.common.planner.victims.pick_victims`
   over the same instance views the planner gets: in-flight and queued requests, and with
   agent memory the blocks of the live sessions homed there, ``session_blocks``).
2. **Drain**: the gateways retire the victim (no new requests; in-flight ones finish). It
   has drained when its core is idle and no gateway still counts a request on it (one held
   in a dispatch shaper counts); checked every ``DRAIN_CHECK_MS``.
3. **Migrate, then remove**: with agent memory in an offload mode
   (:meth:`~services.sim.memory.AgentMemory.migrate`) its sessions' KV goes to the tier and
   they are re-homed; in ``lru`` (or without agent memory) its KV is simply gone.

Measured per victim (:class:`ScaleInRecord`), with agent memory: the victim's *active
sessions* at removal
(:func:`~services.common.sessions.migration.active_sessions`: homed there, not ended, and a turn in flight,
or a turn that ended within ``window_s`` before the removal, or a predicted return after
it), their prefix blocks (each one's last turn's chain), and how many of those blocks are
still cached right after the removal (:func:`kept_prefix`: the longest leading run a next
turn could reuse, on one remaining engine's GPU followed by the tier), and how many were
already there before the migration (the retention controller offloads idle sessions on
its own: those survive a scale-in with or without migration).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

__all__ = ["DRAIN_CHECK_MS", "ScaleInRecord", "kept_prefix"]

DRAIN_CHECK_MS = 50.0


def kept_prefix(
    chain: Sequence[int], gpu_runs: Sequence[int], in_tier: Callable[[int], bool]
) -> int:
    """Blocks of ``chain`` a next turn could reuse: the best over the remaining engines (and
    none) of that engine's leading GPU run (``gpu_runs``) continued by blocks on the tier."""
    best = 0
    for g in (0, *gpu_runs):
        n = min(g, len(chain))
        while n < len(chain) and in_tier(chain[n]):
            n += 1
        best = max(best, n)
    return best


@dataclass(slots=True)
class ScaleInRecord:
    """One victim: when it was chosen and removed (ms), and the measurement at removal."""

    iid: str
    chosen_ms: float
    removed_ms: float | None = None
    sessions: list[str] = field(default_factory=list)  # its active sessions' ids
    prefix_blocks: int = 0
    kept_blocks: int = 0
    # of those, what was on another engine's GPU or the tier before the migration
    kept_unmigrated_blocks: int = 0

    @property
    def kept_ratio(self) -> float | None:
        return self.kept_blocks / self.prefix_blocks if self.prefix_blocks else None
