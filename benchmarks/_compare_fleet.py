"""routing_compare's fleet: the engines of one router's run, started fresh, and how the
router spread its requests over them."""

from __future__ import annotations

import argparse
import fcntl
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from _compare_rules import engine_profile
from _harness import ProcGroup, free_port, http_get, tideserve, wait_http

__all__ = ["engine_requests", "fleet_plan", "start_fleet", "starting"]

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
