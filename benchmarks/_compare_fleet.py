"""routing_compare's fleet: the engines of one router's run, started fresh, when its router
and (parallel runs) the other runs are ready, and how the router spread its requests."""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from _compare_rules import engine_profile
from _harness import ProcGroup, free_port, http_get, tideserve, wait_http

__all__ = [
    "engine_requests", "fleet_plan", "start_fleet", "starting", "wait_barrier", "wait_router"
]  # fmt: skip

START_LOCK = Path(tempfile.gettempdir()) / "tideserve-bench-engine-start.lock"


@contextmanager
def starting(lock: Path = START_LOCK) -> Iterator[None]:
    """Held while one engine starts: every benchmark process on this machine starts its
    engines one at a time, whichever of them is starting."""
    with lock.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def fleet_plan(args: argparse.Namespace) -> list[dict[str, Any]]:
    """One dict per engine: role, url, port, bootstrap_port (prefill only)."""
    roles = (
        ["prefill"] * args.prefill + ["decode"] * args.decode
        if args.pd
        else ["aggregated"] * args.engines
    )
    plan = []
    for role in roles:
        port = free_port()
        plan.append({
            "role": role, "port": port, "url": f"http://127.0.0.1:{port}",
            "bootstrap_port": free_port() if role == "prefill" else 0,
        })  # fmt: skip
    return plan


def start_fleet(
    group: ProcGroup,
    args: argparse.Namespace,
    plan: list[dict[str, Any]],
    tag: str,
    streams: list[str] | None = None,
) -> None:
    """``streams``: ``--redis-url``/``--stream-prefix`` flags for every engine (or none).
    The engines start one at a time on the machine (:func:`starting`), each once the last
    answers its health check: started at once, their imports keep both cores busy for
    seconds, which a benchmark running beside (another run of ``goodput_live --parallel``,
    a long sparse cell) records as a CPU-saturated machine. Each engine's ports are chosen
    again under that lock, just before it binds them: a port found free when the plan was
    made may meanwhile go to an engine of another run starting beside this one."""
    for i, e in enumerate(plan):
        with starting():
            _start_engine(group, args, e, i, tag, streams)


def _start_engine(
    group: ProcGroup,
    args: argparse.Namespace,
    e: dict[str, Any],
    i: int,
    tag: str,
    streams: list[str] | None,
) -> None:
    """Engine ``i`` of the plan on fresh free ports (``e`` updated), once it is healthy."""
    e["port"] = free_port()
    e["url"] = f"http://127.0.0.1:{e['port']}"
    if e["bootstrap_port"]:
        e["bootstrap_port"] = free_port()
    cmd = tideserve(
        "engine", "--role", e["role"], "--port", str(e["port"]),
        "--instance-id", f"{tag}-{e['role']}-{i}", "--profile", engine_profile(args),
        "--kv-blocks", str(args.kv_blocks), "--speedup", str(args.speedup),
        "--stream-interval", str(args.stream_interval),
        "--catch-up-ms", str(args.engine_catch_up_ms),
        "--state-dir", str(group.log_dir / f"engine-{i}"), "--log-level", "WARNING",
        *(streams or []),
    )  # fmt: skip
    if e["bootstrap_port"]:
        cmd += ["--bootstrap-port", str(e["bootstrap_port"])]
    if args.step_traces:
        cmd += ["--step-trace", str(group.log_dir / f"{tag}-engine-{i}.steps.jsonl")]
    env = {"TIDESERVE_ENGINE_BOOTSTRAP_TIMEOUT_S": str(args.bootstrap_timeout_s)}
    group.start(f"{tag}-engine-{i}", cmd, env=env)
    wait_http(e["url"] + "/health", group, 90.0)


def engine_requests(plan: list[dict[str, Any]]) -> list[float]:
    """``sglang:num_requests_total`` of each engine (how the router spread the load)."""
    out = []
    for e in plan:
        status, body = http_get(e["url"] + "/metrics", 5.0)
        value = float("nan")
        for line in body.decode(errors="replace").splitlines() if status == 200 else []:
            if line.startswith("sglang:num_requests_total{"):
                value = float(line.rsplit(" ", 1)[1])
        out.append(value)
    return out


def wait_router(name: str, url: str, n: int, group: ProcGroup) -> None:
    """Ready = answers /v1/models, and (sglang) lists every worker healthy."""
    wait_http(url + "/v1/models", group, 90.0)
    if name.startswith("sglang:"):
        deadline = time.monotonic() + 90.0
        while time.monotonic() < deadline:
            group.check()
            _, body = http_get(url + "/workers")
            try:
                workers = json.loads(body or b"{}").get("workers", [])
            except ValueError:
                workers = []
            if len([w for w in workers if w.get("is_healthy")]) >= n:
                return
            time.sleep(0.3)
        raise RuntimeError(f"{name}: fewer than {n} healthy workers after 90s")
    time.sleep(2.0)  # one health/load scrape round of the gateway


BENCH_STAGGER_S = 10.0
"""Between the benches of a parallel batch: a bench's start-up (imports, the trace) takes
a core for a few seconds, and a dozen at once kept the machine at 100 % for 30 s."""


def wait_barrier(
    spec: str,
    tag: str,
    group: ProcGroup,
    timeout_s: float = 900.0,
    stagger_s: float = BENCH_STAGGER_S,
) -> int:
    """``DIR:N``: leave this run's file in DIR, then wait until DIR holds N files (each run
    of a parallel batch leaves one when its fleet is up), then ``stagger_s`` times this
    run's rank (its file's place in DIR's names), so the benches start one after the other.
    Returns the rank. RuntimeError past ``timeout_s``."""
    where, _, count = spec.rpartition(":")
    d, n = Path(where), int(count)
    d.mkdir(parents=True, exist_ok=True)
    mine = f"{tag}-{os.getpid()}"
    (d / mine).touch()
    deadline = time.monotonic() + timeout_s
    while sum(1 for _ in d.iterdir()) < n:
        if time.monotonic() > deadline:
            raise RuntimeError(f"start barrier {spec}: fewer than {n} runs up after {timeout_s}s")
        group.check()
        time.sleep(0.5)
    rank = sorted(p.name for p in d.iterdir()).index(mine)
    time.sleep(rank * stagger_s)
    return rank
