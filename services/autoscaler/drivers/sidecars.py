"""The sidecars of one local-driver instance: processes that run beside it (a real engine's
kv-bridge, say), started with it, started again when they exit while it runs, and stopped
after it (so a bridge still sees the engine's last events).

Each sidecar's output goes to ``<logs>/<instance>.sidecar<k>.log``. A sidecar that cannot be
started raises :class:`~services.common.planner.driver_base.DriverError` at launch, like the
instance's own command."""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from services.common.local.procs import Child, Supervisor, signal_process
from services.common.local.spec import ChildSpec
from services.common.planner.driver_base import DriverError

__all__ = ["Sidecars"]

log = logging.getLogger(__name__)


class Sidecars:
    """The sidecar processes of one instance (none when ``argvs`` is empty)."""

    def __init__(
        self,
        instance_id: str,
        argvs: Sequence[tuple[str, ...]],
        env: Mapping[str, str],
        logs: Path,
        procs: Supervisor,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._specs = [
            ChildSpec(
                name=f"{instance_id}-sidecar{k}",
                argv=argv,
                env=env,
                log_path=logs / f"{instance_id}.sidecar{k}.log",
                kind="sidecar",
            )
            for k, argv in enumerate(argvs)
        ]
        self._procs = procs
        self._clock = clock
        self.children: list[Child | None] = [None] * len(self._specs)
        self.restarts = 0

    def start(self) -> None:
        """Start every sidecar not running. DriverError when one cannot be exec'd."""
        for k, spec in enumerate(self._specs):
            old = self.children[k]
            if old is not None and old.exit_code() is None:
                continue
            try:
                self.children[k] = self._procs.start(spec, replacing=old)
            except OSError as e:
                raise DriverError(f"{spec.name}: cannot start {spec.argv[0]!r}: {e}") from e

    def revive(self) -> None:
        """Start again the sidecars that exited (the instance still runs)."""
        for k, child in enumerate(self.children):
            code = None if child is None else child.exit_code()
            if code is not None:
                log.warning("%s exited with code %d; starting it again", self._specs[k].name, code)
                self.restarts += 1
        self.start()

    async def stop(self, grace_s: float) -> None:
        """SIGTERM every sidecar, SIGKILL after ``grace_s``; returns once all are gone."""
        running = [c for c in self.children if c is not None and c.exit_code() is None]
        for child in running:
            signal_process(child.ref, signal.SIGTERM)
        deadline = self._clock() + grace_s
        while any(c.exit_code() is None for c in running):
            if self._clock() >= deadline:
                for c in running:
                    if c.exit_code() is None:
                        signal_process(c.ref, signal.SIGKILL)
                deadline = self._clock() + 30.0
            await asyncio.sleep(0.05)
