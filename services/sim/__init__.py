"""``tideserve sim``: the control plane in virtual time (see README.md)."""

from __future__ import annotations

import time
from typing import Any

from services.common.bench.traces import Trace
from services.sim.config import SimConfig, SimConfigError
from services.sim.events import fewer_collections
from services.sim.results import summary
from services.sim.run import Progress, SimRun, Simulation

__all__ = ["SimConfig", "SimConfigError", "SimRun", "Simulation", "simulate"]


def simulate(
    cfg: SimConfig, trace: Trace, progress: Progress | None = None
) -> tuple[dict[str, Any], SimRun]:
    """Run ``cfg`` over ``trace``: (the bench-shaped summary, the run's records). Raises
    ``SimConfigError`` for a config it cannot run (``UnknownProfile`` included)."""
    from services.sim.routing import UnknownProfile

    wall0, cpu0 = time.perf_counter(), time.process_time()
    with fewer_collections():
        try:
            sim = Simulation(cfg, trace)
        except UnknownProfile as exc:
            raise SimConfigError(str(exc)) from None
        run = sim.run(progress)
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    return summary(run, wall_s=wall, cpu_s=cpu), run
