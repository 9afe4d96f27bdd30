"""``tideserve down`` and ``tideserve status``: act on a running stack through its state file."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TextIO

from services.common.local.procs import ProcRef, is_alive, signal_process, stop_processes
from services.common.local.recorded import clear_recorded, read_recorded
from services.common.local.state import ProcEntry, StackState, read_state, remove_state, state_path
from services.stack.health import Health, check_grpc_health, check_http_ready

_STOP_ORDER = ("service", "redis", "postgres")
"""Leftovers are stopped in this order of kinds (unknown kinds, e.g. engines, go first)."""


@dataclass(frozen=True)
class DownResult:
    """What ``down`` did: whether it ``signalled_up``; processes it had to stop itself because
    ``up`` was gone or too slow (``orphans``); those among them that needed SIGKILL
    (``killed``); anything it could not stop (``still_alive``)."""

    was_running: bool
    signalled_up: bool
    killed: tuple[str, ...]
    still_alive: tuple[str, ...]
    orphans: tuple[str, ...] = ()


def stop_order(entries: Sequence[ProcRef], kinds: Sequence[str]) -> list[list[ProcRef]]:
    """Group ``entries`` (parallel to ``kinds``) into stop waves: anything not in _STOP_ORDER
    first, then services, Redis, Postgres. Pure."""
    rank = {k: i + 1 for i, k in enumerate(_STOP_ORDER)}
    waves: dict[int, list[ProcRef]] = {}
    for ref, kind in zip(entries, kinds, strict=True):
        waves.setdefault(rank.get(kind, 0), []).append(ref)
    return [waves[r] for r in sorted(waves)]


_STACK_ROLE = {"worker": "aggregated"}
"""The driver's role kinds in the stack's words (aggregated, prefill, decode)."""


def recorded_engines(state: StackState) -> list[ProcEntry]:
    """The engines the autoscaler's local driver recorded for the stack (``engine_dir``), as
    entries of kind ``engine``: they are children of the autoscaler, not of ``up``, and
    outlive a SIGKILLed autoscaler. ValueError for a record that cannot be read."""
    if state.engine_dir is None:
        return []
    return [
        ProcEntry(
            e.instance_id,
            e.pid,
            e.create_time,
            kind="engine",
            log=e.log or None,
            url=e.endpoint,
            ready_url=e.endpoint.rstrip("/") + "/health",
            role=_STACK_ROLE.get(e.role, e.role),
        )
        for e in read_recorded(Path(state.engine_dir))
    ]


def stack_down(
    state_dir: Path,
    *,
    up_timeout_s: float = 60.0,
    stop_timeout_s: float = 10.0,
    sleep: Callable[[float], None] = time.sleep,
) -> DownResult:
    """Ask the recorded ``up`` to stop (SIGTERM) and wait for it and every recorded process to
    be gone; after ``up_timeout_s`` stop leftovers directly (SIGTERM, ``stop_timeout_s``,
    SIGKILL) in stop order. Engines the autoscaler recorded (:func:`recorded_engines`) are
    waited for and stopped (first) the same way, so those of a SIGKILLed autoscaler do not
    survive ``down``. Idempotent. Raises ValueError for an unreadable state file or record."""
    state = read_state(state_dir)
    if state is None:
        return DownResult(False, False, (), ())
    recorded = [*state.processes, *recorded_engines(state)]
    everyone = [state.up.ref, *(p.ref for p in recorded)]
    if not any(is_alive(r) for r in everyone):
        _forget(state_dir, state)
        return DownResult(False, False, (), ())
    signalled = signal_process(state.up.ref, signal.SIGTERM)
    if signalled:
        deadline = time.monotonic() + up_timeout_s
        while any(is_alive(r) for r in everyone) and time.monotonic() < deadline:
            sleep(0.2)
    killed: list[str] = []
    leftovers = [p for p in recorded if is_alive(p.ref)]
    if is_alive(state.up.ref):
        killed += [r.name for r in stop_processes([state.up.ref], stop_timeout_s)]
    for wave in stop_order([p.ref for p in leftovers], [p.kind for p in leftovers]):
        killed += [r.name for r in stop_processes(wave, stop_timeout_s)]
    still = tuple(r.name for r in everyone if is_alive(r))
    if not still:
        _forget(state_dir, state)
    return DownResult(True, signalled, tuple(killed), still, tuple(p.name for p in leftovers))


def _forget(state_dir: Path, state: StackState) -> None:
    """Everything recorded is gone: remove the engine record, then the state file."""
    if state.engine_dir is not None:
        clear_recorded(Path(state.engine_dir))
    remove_state(state_dir)


@dataclass(frozen=True)
class ServiceStatus:
    name: str
    address: str
    pid: int
    alive: bool
    health: str
    metrics_url: str | None


def collect_status(
    state: StackState,
    probe: Callable[[str, str, float], Health] = check_grpc_health,
    timeout_s: float = 2.0,
) -> list[ServiceStatus]:
    """Probe every recorded gRPC service (health of the server overall)."""
    out = []
    for entry in state.services():
        assert entry.grpc_address is not None
        out.append(
            ServiceStatus(
                name=entry.name,
                address=entry.grpc_address,
                pid=entry.pid,
                alive=is_alive(entry.ref),
                health=probe(entry.grpc_address, "", timeout_s).value,
                metrics_url=entry.metrics_url,
            )
        )
    return out


@dataclass(frozen=True)
class EngineStatus:
    """A simulated engine of the stack: ``health`` is SERVING when ``GET /health`` is 200."""

    name: str
    role: str
    url: str
    pid: int
    alive: bool
    health: str


def collect_engine_status(
    state: StackState,
    probe: Callable[[str, float], Health] = check_http_ready,
    timeout_s: float = 2.0,
) -> list[EngineStatus]:
    """Probe every engine over HTTP (its ``ready_url``): those ``up`` started and those the
    autoscaler's local driver recorded (:func:`recorded_engines`)."""
    out = []
    for entry in [*state.engines(), *recorded_engines(state)]:
        target = entry.ready_url or ((entry.url or "").rstrip("/") + "/health")
        out.append(
            EngineStatus(
                name=entry.name,
                role=entry.role,
                url=entry.url or "",
                pid=entry.pid,
                alive=is_alive(entry.ref),
                health=probe(target, timeout_s).value,
            )
        )
    return out


def all_serving(statuses: Sequence[ServiceStatus], engines: Sequence[EngineStatus] = ()) -> bool:
    """True when there is at least one service, every one is SERVING and so is every engine.
    Pure."""
    healthy = [s.health for s in statuses] + [e.health for e in engines]
    return bool(statuses) and all(h == Health.SERVING.value for h in healthy)


def status_report(
    state: StackState | None,
    statuses: Sequence[ServiceStatus],
    engines: Sequence[EngineStatus] = (),
) -> dict[str, Any]:
    """The ``status --json`` document. Pure."""
    if state is None:
        return {"running": False, "services": [], "infra": []}
    infra = [
        {"name": p.name, "pid": p.pid, "alive": is_alive(p.ref), "url": p.url}
        for p in state.processes
        if p.grpc_address is None and p.kind != "engine"
    ]
    return {
        "running": is_alive(state.up.ref),
        "phase": state.phase,
        "state_dir": state.state_dir,
        "up_pid": state.up.pid,
        "postgres_url": state.postgres_url,
        "redis_url": state.redis_url,
        "serving": all_serving(statuses, engines),
        "gateway_url": state.gateway_url,
        "services": [asdict(s) for s in statuses],
        "engines": [asdict(e) for e in engines],
        "infra": infra,
    }


def print_status(report: dict[str, Any], out: TextIO, as_json: bool) -> None:
    if as_json:
        print(json.dumps(report), file=out)
        return
    if "state_dir" not in report:
        print("no stack running (no state file)", file=out)
        return
    up = "running" if report["running"] else "NOT running"
    print(f"stack in {report['state_dir']}: up pid {report['up_pid']} {up}", file=out)
    print(
        f"  {'service':<11} {'address':<22} {'pid':>7} {'alive':<5} {'health':<15} metrics",
        file=out,
    )
    for s in report["services"]:
        print(
            f"  {s['name']:<11} {s['address']:<22} {s['pid']:>7} "
            f"{'yes' if s['alive'] else 'no':<5} {s['health']:<15} {s['metrics_url'] or '-'}",
            file=out,
        )
    engines = report.get("engines", [])
    if engines:
        print(
            f"  {'engine':<11} {'url':<22} {'pid':>7} {'alive':<5} {'health':<15} role",
            file=out,
        )
    for e in engines:
        where = e["url"].removeprefix("http://")
        print(
            f"  {e['name']:<11} {where:<22} {e['pid']:>7} "
            f"{'yes' if e['alive'] else 'no':<5} {e['health']:<15} {e['role']}",
            file=out,
        )
    if report.get("gateway_url"):
        print(f"  gateway (OpenAI API): {report['gateway_url']}", file=out)
    for p in report["infra"]:
        print(
            f"  {p['name']:<11} {'':<22} {p['pid']:>7} {'yes' if p['alive'] else 'no':<5}",
            file=out,
        )


__all__ = [
    "DownResult",
    "EngineStatus",
    "ServiceStatus",
    "all_serving",
    "collect_engine_status",
    "collect_status",
    "print_status",
    "recorded_engines",
    "stack_down",
    "state_path",
    "status_report",
    "stop_order",
]
