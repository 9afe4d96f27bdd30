"""Driving ``tideserve up`` / ``status`` / ``down`` as real processes in e2e tests."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from services.common.local.procs import stop_processes
from services.common.local.state import StackState, read_state
from tests.helpers.databases import fresh_database

__all__ = ["RunningStack", "cli", "running_stack", "status_json", "wait_running"]


def cli() -> list[str]:
    """The command that runs the ``tideserve`` CLI of this venv (the console script if
    installed, else ``python -m services.cli``)."""
    script = Path(sys.executable).parent / "tideserve"
    return [str(script)] if script.exists() else [sys.executable, "-m", "services.cli"]


def wait_running(up: subprocess.Popen[str], state_dir: Path, timeout_s: float) -> StackState:
    """Poll the state file until the stack's phase is "running" and return that state.

    Fails the test (with ``up``'s stderr) if ``up`` exits first, or after ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if up.poll() is not None:
            _, err = up.communicate()
            pytest.fail(f"`tideserve up` exited with {up.returncode} before running:\n{err}")
        state = read_state(state_dir)
        if state is not None and state.phase == "running":
            return state
        time.sleep(0.5)
    pytest.fail("`tideserve up` did not reach running")


def status_json(state_dir: Path) -> tuple[int, dict[str, Any]]:
    """``tideserve status --json``: (exit code, report)."""
    res = subprocess.run(
        [*cli(), "status", "--state-dir", str(state_dir), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return res.returncode, json.loads(res.stdout)


@dataclass
class RunningStack:
    """A stack started by :func:`running_stack`: ``state`` as first seen running; after the
    block, ``out``/``err`` hold ``up``'s output (once ``down`` stopped it)."""

    state_dir: Path
    up: subprocess.Popen[str]
    state: StackState
    out: str = ""
    err: str = ""


@contextlib.contextmanager
def running_stack(
    config: Mapping[str, Any],
    flags: Sequence[str],
    *,
    postgres_url: str,
    redis_url: str,
    start_timeout_s: float = 180.0,
    up_exit: int | None = 0,
    env: Mapping[str, str] | None = None,
) -> Iterator[RunningStack]:
    """``tideserve up`` with ``config`` (written as its YAML file), the external Postgres and
    Redis and ``flags``, in a fresh short state dir and a fresh database of that Postgres (as
    with the embedded one: its autoscaler resumes no other stack's stored deployments);
    yields once the stack runs. On a normal
    exit ``tideserve down`` must succeed and ``up`` must stop with ``up_exit`` (None: whatever,
    e.g. the test killed it; its output is then in the yielded object); on any exit nothing it recorded is left running and the state dir is
    removed. ``env``: more environment for ``up`` (and so for every process it starts)."""
    with fresh_database(postgres_url) as own_db:
        yield from _running_stack(
            config, flags, postgres_url=own_db, redis_url=redis_url,
            start_timeout_s=start_timeout_s, up_exit=up_exit, env=env or {},
        )  # fmt: skip


def _running_stack(
    config: Mapping[str, Any],
    flags: Sequence[str],
    *,
    postgres_url: str,
    redis_url: str,
    start_timeout_s: float,
    up_exit: int | None,
    env: Mapping[str, str],
) -> Iterator[RunningStack]:
    state_dir = Path(tempfile.mkdtemp(prefix="tsstk-"))  # short: unix sockets live under it
    path = state_dir / "tideserve.yaml"
    # One gateway unless the test says otherwise (the default, one per core, would make the
    # stack's size depend on the machine running the test).
    stack_section = {"gateways": 1, **config.get("stack", {})}
    path.write_text(yaml.safe_dump({**config, "stack": stack_section, "log_format": "text"}))
    up = subprocess.Popen(
        [*cli(), "up", "--state-dir", str(state_dir), "--config", str(path),
         "--postgres-url", postgres_url, "--redis-url", redis_url,
         "--start-timeout", str(start_timeout_s), *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **env},
    )  # fmt: skip
    try:
        stack = RunningStack(state_dir, up, wait_running(up, state_dir, start_timeout_s + 30))
        yield stack
        down = subprocess.run(
            [*cli(), "down", "--state-dir", str(state_dir)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert down.returncode == 0, down.stdout + down.stderr
        stack.out, stack.err = up.communicate(timeout=60)
        assert up_exit is None or up.returncode == up_exit, stack.err
        assert read_state(state_dir) is None
    finally:
        if up.poll() is None:
            up.send_signal(signal.SIGTERM)
            try:
                up.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                up.kill()
                up.communicate()
        leftover = read_state(state_dir)
        if leftover is not None:
            stop_processes([leftover.up.ref, *(p.ref for p in leftover.processes)], 5.0)
        shutil.rmtree(state_dir, ignore_errors=True)
