"""A `tideserve up` stack with simulated engines, driven as real processes (e2e tests).

`start_engine_stack` runs `up` on the session's Postgres/Redis with the four services and
the engines on ephemeral ports, then `down` at the end (asserting a clean stop); `stream_sse`
POSTs a streamed request through the gateway and parses its SSE answer into an `Outcome`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import redis.asyncio as aioredis
from tideserve.v1 import events_pb2

from services.common.local.procs import is_alive
from services.common.local.state import ProcEntry, StackState, read_state
from services.common.streams import decode_entry
from services.stack.control import recorded_engines
from tests.helpers.ports import free_ports
from tests.helpers.stack import running_stack

START_TIMEOUT_S = 180.0  # 2 shared cores: the services can be slow to import
REQUEST_TIMEOUT_S = 60.0  # a client timeout: no request may hang
SERVICES = ("scheduler", "kvmeta", "autoscaler", "telemetry")


@dataclass
class EngineStack:
    state_dir: Path
    up: subprocess.Popen[str]
    gateway: str  # http://127.0.0.1:PORT (no /v1)
    deployment: str
    engines: dict[str, ProcEntry] = field(default_factory=dict)

    def state(self) -> StackState:
        st = read_state(self.state_dir)
        assert st is not None, "state file gone"
        return st


@contextlib.contextmanager
def start_engine_stack(
    postgres_url: str,
    redis_url: str,
    n_engines: int,
    engine_flags: list[str],
    *,
    kv_blocks: int = 512,
    health_interval_s: float = 0.5,
    up_exit: int | None = 0,
) -> Iterator[EngineStack]:
    """`tideserve up` (through :func:`tests.helpers.stack.running_stack`) with the four
    services and ``n_engines`` engine ports, all ephemeral, the scheduler on its own
    deployment (own KV streams in the shared Redis); after the block, `down` stopped it all and `up` printed the gateway and every engine."""
    ports = iter(free_ports(6 + n_engines))
    layout: dict[str, Any] = {
        name: {"grpc_port": next(ports), "metrics_port": 0} for name in SERVICES
    }
    http_port = next(ports)
    deployment = f"e2e-{uuid.uuid4().hex[:8]}"  # own KV streams in the shared Redis
    layout["scheduler"].update(
        http_port=http_port,
        deployment=deployment,
        health_interval_s=health_interval_s,
    )
    layout["kvmeta"]["metadata_http_port"] = next(ports)
    config = {**layout, "stack": {"engine_ports": [next(ports) for _ in range(n_engines)]}}
    flags = ["--engine-profile", "test", "--engine-kv-blocks", str(kv_blocks), *engine_flags]
    with running_stack(
        config,
        flags,
        postgres_url=postgres_url,
        redis_url=redis_url,
        start_timeout_s=START_TIMEOUT_S,
        up_exit=up_exit,
    ) as running:
        state = running.state
        assert state.gateway_url == f"http://127.0.0.1:{http_port}/v1"
        engines = recorded_engines(state)  # the autoscaler's driver runs them
        assert len(engines) == n_engines, engines
        yield EngineStack(
            running.state_dir,
            running.up,
            f"http://127.0.0.1:{http_port}",
            deployment,
            {p.name: p for p in engines},
        )
    assert f"gateway (OpenAI API): http://127.0.0.1:{http_port}/v1" in running.out
    for entry in engines:
        assert f"{entry.name:<11} {entry.role} engine {entry.url}" in running.out
    assert [p.name for p in [*state.processes, *engines] if is_alive(p.ref)] == []


def words(n: int, salt: str) -> str:
    return " ".join(f"w{salt}{i}" for i in range(n))


@dataclass
class Outcome:
    status: int = 0
    chunks: int = 0  # data events with content, before any error
    text: str = ""
    done: bool = False  # saw data: [DONE]
    error: dict[str, Any] | None = None  # the SSE error event's "error" object
    malformed: str = ""
    body: dict[str, Any] | None = None
    usage: dict[str, Any] | None = None


class StartCounter:
    """Counts requests that received their first content chunk; ``reached`` is set at
    ``target``."""

    def __init__(self, target: int) -> None:
        self.count = 0
        self.target = target
        self.reached = asyncio.Event()

    def hit(self) -> None:
        self.count += 1
        if self.count >= self.target:
            self.reached.set()


async def stream_sse(
    session: aiohttp.ClientSession,
    url: str,
    body: dict[str, Any],
    started: StartCounter | None = None,
) -> Outcome:
    """POST a streamed request and parse its SSE answer (``started`` is told when the first
    content chunk arrives)."""
    out = Outcome()
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    async with session.post(url, json={**body, "stream": True}, timeout=timeout) as resp:
        out.status = resp.status
        if resp.status != 200:
            out.body = await resp.json(content_type=None)
            return out
        async for raw in resp.content:
            line = raw.decode().strip()
            if not line:
                continue
            if not line.startswith("data:"):
                out.malformed = line
                continue
            payload = line[5:].strip()
            if payload == "[DONE]":
                out.done = True
                continue
            try:
                event = json.loads(payload)
            except json.JSONDecodeError:
                out.malformed = payload
                continue
            if "error" in event:
                out.error = event["error"]
                continue
            if event.get("usage"):
                out.usage = event["usage"]
            for choice in event.get("choices", []):
                piece = choice.get("delta", {}).get("content") or choice.get("text") or ""
                if piece:
                    if out.chunks == 0 and started is not None:
                        started.hit()
                    out.chunks += 1
                    out.text += piece
    return out


def metric_total_with(text: str, name: str, label: str) -> float:
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name + "{") and label in line
    )


def metric_total(text: str, name: str) -> float:
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name + "{") or line.startswith(name + " ")
    )


async def request_records(
    redis_url: str, deployment: str, n: int
) -> list[events_pb2.RequestRecord]:
    """This deployment's request records (``ts:requests``), once at least ``n`` are on the
    stream (or what is there after 30 s)."""
    rc = aioredis.Redis.from_url(redis_url, decode_responses=False)
    try:
        deadline = time.monotonic() + 30
        while True:
            recs = [
                decode_entry(f, events_pb2.RequestRecord) for _, f in await rc.xrange("ts:requests")
            ]
            mine = [r for r in recs if r.deployment == deployment]
            if len(mine) >= n or time.monotonic() > deadline:
                return mine
            await asyncio.sleep(0.2)
    finally:
        await rc.aclose()
