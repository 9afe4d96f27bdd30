"""Engines a previous run of the local driver left running, taken over by the next run.

A driver that is SIGKILLed (or crashes) leaves its engines running: they keep serving, with
their KV caches warm. When the driver starts again on the same state dir it reads their
record (:mod:`services.common.local.recorded`) and keeps the live ones as **orphans**; the first
``scale`` of an orphan's role adopts it instead of launching a new process (same instance
id, endpoint and port; STARTING until its readiness probe answers, then READY), up to the
role's replica count. Orphans no role wants (beyond a count, or of a role no longer in the
spec) are stopped by the driver. An adopted engine is not the driver's child: its exit is
seen by polling that its process is gone, and its exit code is unknown (-1).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from services.common.local.procs import ProcRef, is_alive, stop_processes
from services.common.local.recorded import RecordedEngine, clear_recorded, read_recorded
from services.common.local.spec import ChildSpec

__all__ = ["AdoptedChild", "Orphans"]

log = logging.getLogger(__name__)

UNKNOWN_EXIT = -1


@dataclass
class AdoptedChild:
    """An engine process the driver took over (not its child): what a ``Child`` offers."""

    spec: ChildSpec
    ref: ProcRef

    def exit_code(self) -> int | None:
        """None while the process runs, else -1 (its real exit code is not ours to see)."""
        return None if is_alive(self.ref) else UNKNOWN_EXIT

    @classmethod
    def of(cls, engine: RecordedEngine) -> AdoptedChild:
        spec = ChildSpec(
            name=engine.instance_id,
            argv=(),
            env={},
            log_path=Path(engine.log) if engine.log else Path("/dev/null"),
            kind="engine",
        )
        return cls(spec, engine.ref)


class Orphans:
    """The live engines an earlier run recorded, until adopted or stopped."""

    def __init__(self, engines: Sequence[RecordedEngine] = ()) -> None:
        self._left = [e for e in engines if is_alive(e.ref)]

    @classmethod
    def load(cls, state_dir: Path) -> Orphans:
        """The live recorded engines of ``state_dir`` (the record is cleared: the driver
        rewrites it with what it adopts); none, logged, for an unreadable record."""
        try:
            orphans = cls(read_recorded(state_dir))
        except ValueError as e:
            log.warning("local driver: ignoring an unreadable engine record: %s", e)
            return cls()
        clear_recorded(state_dir)
        if orphans:
            log.warning(
                "local driver: %d engine(s) an earlier run left running, to adopt",
                len(orphans),
            )
        return orphans

    def __len__(self) -> int:
        return len(self._left)

    def take(self, deployment: str, role_name: str) -> RecordedEngine | None:
        """One live orphan of this role (lowest instance id first), now the caller's."""
        mine = sorted(
            (e for e in self._left if (e.deployment, e.role_name) == (deployment, role_name)),
            key=lambda e: e.instance_id,
        )
        for engine in mine:
            self._left.remove(engine)
            if is_alive(engine.ref):
                return engine
        return None

    def drop(self, deployment: str | None = None, role_name: str | None = None) -> list[ProcRef]:
        """Give up the orphans of a role (every orphan when None): the caller stops them."""
        gone = [
            e
            for e in self._left
            if (deployment is None or e.deployment == deployment)
            and (role_name is None or e.role_name == role_name)
        ]
        for e in gone:
            self._left.remove(e)
        return [e.ref for e in gone if is_alive(e.ref)]

    async def stop(self, deployment: str | None, role_name: str | None, grace_s: float) -> None:
        """Stop (SIGTERM, ``grace_s``, SIGKILL) the orphans :meth:`drop` gives up."""
        refs = self.drop(deployment, role_name)
        if refs:
            log.warning(
                "local driver: stopping %d engine(s) of an earlier run no role wants: %s",
                len(refs),
                ", ".join(r.name for r in refs),
            )
            await asyncio.to_thread(stop_processes, refs, grace_s)
