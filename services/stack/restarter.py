"""The shell of ``tideserve up``'s service restarts: applies :mod:`.restarts` (pure) to the
supervisor's exited children, one decision per death, and starts each when it is due."""

from __future__ import annotations

import time
from collections.abc import Callable

from services.common.local.procs import Child, Supervisor
from services.stack.restarts import RestartPolicy, plan_restart

__all__ = ["Restarter"]


class Restarter:
    """``say`` reports; ``restarted(new)`` is told of each new process (to record it)."""

    def __init__(
        self,
        policy: RestartPolicy,
        supervisor: Supervisor,
        say: Callable[[str], None],
        restarted: Callable[[Child], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.policy = policy
        self._supervisor = supervisor
        self._say = say
        self._restarted = restarted
        self._clock = clock
        self._history: dict[str, tuple[float, ...]] = {}  # name -> recent restart times
        self._due: dict[str, float] = {}  # name -> when its planned restart is due

    def plan(self, child: Child, died: str) -> bool:
        """True when ``child`` (exited; ``died`` says how) is, or is now, due a restart;
        False when restarts are off or it is crash-looping."""
        name = child.spec.name
        if name in self._due:
            return True
        now = self._clock()
        plan = plan_restart(self._history.get(name, ()), now, self.policy)
        if not plan.restart:
            if self.policy.max_restarts:
                self._say(
                    f"{name} was restarted {len(plan.history)} times within "
                    f"{self.policy.window_s:g}s; not restarting it again"
                )
            return False
        self._history[name] = plan.history
        self._due[name] = now + plan.delay_s
        delay = f" in {plan.delay_s:g}s" if plan.delay_s else ""
        self._say(f"{died}; restarting it{delay}")
        return True

    def start_due(self) -> None:
        """Start again each exited child whose restart is due."""
        now = self._clock()
        for child, _code in self._supervisor.exited():
            name = child.spec.name
            if self._due.get(name, now + 1) > now:
                continue
            del self._due[name]
            try:
                new = self._supervisor.start(child.spec, replacing=child)
            except OSError as exc:
                self._say(f"restarting {name} failed: {exc}")
                continue
            self._restarted(new)
            self._say(f"restarted {name} (pid {new.ref.pid})")
