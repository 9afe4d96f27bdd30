"""Engine processes recorded by the process that runs them (the autoscaler's ``local``
driver), so that they can be found and stopped when that process is gone.

The owner rewrites ``<dir>/instances.json`` (atomically) whenever one of its engine processes
starts or stops: one :class:`RecordedEngine` per live process, identified by pid *and* start
time (a recycled pid is never signalled). A SIGKILLed autoscaler cannot stop its engines and
nothing adopts them; whoever comes next reads the record and stops them
(:func:`stop_recorded`): the driver when it starts again, ``tideserve down`` for a stack.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from services.common.local.procs import ProcRef, is_alive, stop_processes
from services.common.local.state import write_json_atomic

__all__ = [
    "RECORD_FILE",
    "RecordedEngine",
    "clear_recorded",
    "read_recorded",
    "stop_recorded",
    "write_recorded",
]

RECORD_FILE = "instances.json"
RECORD_VERSION = 1


@dataclass(frozen=True)
class RecordedEngine:
    """One engine process: its instance id, deployment and role, endpoint, log and pid."""

    instance_id: str
    deployment: str
    role_name: str
    role: str
    endpoint: str
    pid: int
    create_time: float | None
    log: str = ""

    @property
    def ref(self) -> ProcRef:
        return ProcRef(self.instance_id, self.pid, self.create_time)


def write_recorded(directory: Path, owner_pid: int, engines: Sequence[RecordedEngine]) -> None:
    """Atomically replace the record in ``directory`` with ``engines``."""
    write_json_atomic(
        directory / RECORD_FILE,
        {
            "version": RECORD_VERSION,
            "owner_pid": owner_pid,
            "engines": [asdict(e) for e in engines],
        },
    )


def read_recorded(directory: Path) -> list[RecordedEngine]:
    """The recorded engines ([] without a record). ValueError for a record this version
    cannot read."""
    path = directory / RECORD_FILE
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return []
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not JSON ({exc})") from exc
    if not isinstance(data, dict) or data.get("version") != RECORD_VERSION:
        raise ValueError(f"{path}: not an engine record of version {RECORD_VERSION}")
    try:
        return [RecordedEngine(**e) for e in data.get("engines", [])]
    except TypeError as exc:
        raise ValueError(f"{path}: malformed engine entry ({exc})") from exc


def stop_recorded(directory: Path, timeout_s: float) -> tuple[list[str], list[str]]:
    """Stop every recorded engine still alive (SIGTERM, ``timeout_s``, SIGKILL) and clear the
    record. Returns (stopped, killed) instance ids. ValueError as :func:`read_recorded`."""
    alive = [e for e in read_recorded(directory) if is_alive(e.ref)]
    killed = [r.name for r in stop_processes([e.ref for e in alive], timeout_s)]
    clear_recorded(directory)
    return [e.instance_id for e in alive], killed


def clear_recorded(directory: Path) -> None:
    """Delete the record (idempotent): call it once every recorded engine is gone."""
    (directory / RECORD_FILE).unlink(missing_ok=True)
