"""What ``tideserve up`` prints once the stack serves (pure: state in, text out)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from services.common.local.state import ProcEntry, StackState, redact_url
from services.stack.engines import ENGINE_KIND

__all__ = ["NO_ENGINE", "Announced", "announcement"]

NO_ENGINE = (
    "NOTE: no simulated engine was started: the gateway routes only to the "
    "scheduler's own endpoints, if any, and answers 503 while no engine serves "
    "(`tideserve up --engines N` starts N)"
)


class Announced(Protocol):
    """What the announcement reads of ``up``'s options (``services.stack.up.UpOptions``)."""

    @property
    def state_dir(self) -> Path: ...
    @property
    def postgres_url(self) -> str | None: ...
    @property
    def redis_url(self) -> str | None: ...


def announcement(state: StackState, engines: Sequence[ProcEntry], opts: Announced) -> str:
    """One line per process with its addresses, the external stores, the gateway, logs."""
    lines = [f"tideserve stack is up (state dir {opts.state_dir})"]
    for entry in state.processes:
        if entry.grpc_address is not None:
            where = f"gRPC {entry.grpc_address}"
            for purpose, url in entry.endpoints.items():
                where += f"  {purpose} {url}"
        elif entry.kind == ENGINE_KIND:
            where = f"{entry.role} engine {entry.url or '?'}"
        else:
            where = redact_url(entry.url or "")
        lines.append(f"  {entry.name:<11} {where}  (pid {entry.pid})")
    for e in engines:
        lines.append(f"  {e.name:<11} {e.role} engine {e.url or '?'}  (pid {e.pid})")
    if opts.postgres_url is not None:
        lines.append(f"  {'postgres':<11} external {state.postgres_url}")
    if opts.redis_url is not None:
        lines.append(f"  {'redis':<11} external {state.redis_url}")
    if state.gateway_url is not None:
        lines.append(f"gateway (OpenAI API): {state.gateway_url}")
        if not engines and all(p.kind != ENGINE_KIND for p in state.processes):
            lines.append(NO_ENGINE)
    lines.append(f"logs: {opts.state_dir / 'logs'}")
    lines.append("Ctrl-C or `tideserve down` stops everything.")
    return "\n".join(lines)
