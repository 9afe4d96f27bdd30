"""The stack state file (``<state_dir>/stack.json``): who runs, with which pid, on which port.

Written by ``tideserve up`` after every process it starts (so ``down`` can clean up even after
a crash mid-start) and read by ``down`` and ``status``, and by CLIs looking for the stack's
addresses (:mod:`services.common.local.client`). Writes are atomic (temp file + rename).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from services.common.local.procs import ProcRef

STATE_FILE = "stack.json"
STATE_VERSION = 1


def default_state_dir() -> Path:
    """``$XDG_DATA_HOME/tideserve`` or ``~/.local/share/tideserve``."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "tideserve"


@dataclass
class ProcEntry:
    """A recorded process. ``grpc_address`` is set for gRPC services."""

    name: str
    pid: int
    create_time: float | None
    kind: str
    grpc_address: str | None = None
    grpc_service: str = ""
    metrics_url: str | None = None
    log: str | None = None
    url: str | None = None
    endpoints: dict[str, str] = field(default_factory=dict)
    """HTTP endpoints seen listening once SERVING, by purpose (``metrics``, ``gateway``)."""
    ready_url: str | None = None
    """HTTP readiness/health URL of a non-gRPC child (engines: ``<url>/health``)."""
    role: str = ""
    """Engines: aggregated, prefill or decode."""

    @property
    def ref(self) -> ProcRef:
        return ProcRef(self.name, self.pid, self.create_time)


@dataclass
class StackState:
    """Everything ``down``/``status`` need. ``phase`` is starting | running | stopping."""

    up: ProcEntry
    state_dir: str
    phase: str = "starting"
    postgres_url: str | None = None
    redis_url: str | None = None
    processes: list[ProcEntry] = field(default_factory=list)
    version: int = STATE_VERSION
    gateway_url: str | None = None
    """The OpenAI-compatible gateway (``http://host:port/v1``) once it answers."""
    engine_dir: str | None = None
    """Where the autoscaler's local driver records the engines it runs for the stack
    (services.common.local.recorded); ``down`` and ``status`` find them there. None: no such engines."""

    def services(self) -> list[ProcEntry]:
        return [p for p in self.processes if p.grpc_address is not None]

    def engines(self) -> list[ProcEntry]:
        return [p for p in self.processes if p.kind == "engine"]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StackState:
        """Raises ValueError on a file this version cannot read."""
        try:
            if data.get("version") != STATE_VERSION:
                raise ValueError(f"unsupported state version {data.get('version')!r}")
            return cls(
                up=ProcEntry(**data["up"]),
                state_dir=str(data["state_dir"]),
                phase=str(data.get("phase", "starting")),
                postgres_url=data.get("postgres_url"),
                redis_url=data.get("redis_url"),
                processes=[ProcEntry(**p) for p in data.get("processes", [])],
                gateway_url=data.get("gateway_url"),
                engine_dir=data.get("engine_dir"),
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"malformed state file: {exc}") from exc


def state_path(state_dir: Path) -> Path:
    return state_dir / STATE_FILE


def write_json_atomic(path: Path, data: Any) -> None:
    """Replace ``path`` with ``data`` as JSON (temp file + rename: readers never see half)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp.{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(path)


def write_state(state_dir: Path, state: StackState) -> None:
    """Atomically replace the state file."""
    write_json_atomic(state_path(state_dir), state.to_json())


def read_state(state_dir: Path) -> StackState | None:
    """The recorded state, or None when there is no state file. Raises ValueError when the
    file exists but cannot be understood."""
    path = state_path(state_dir)
    try:
        raw = path.read_text()
    except FileNotFoundError:
        return None
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a JSON object")
    return StackState.from_json(data)


def remove_state(state_dir: Path) -> None:
    """Delete the state file if present (idempotent)."""
    state_path(state_dir).unlink(missing_ok=True)


def redact_url(url: str) -> str:
    """``url`` with any password replaced by ``***`` (for printing and the state file)."""
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest:
        return url
    creds, at, host = rest.rpartition("@")
    user, colon, _ = creds.partition(":")
    return f"{scheme}://{user}{':***' if colon else ''}{at}{host}"
