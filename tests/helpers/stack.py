"""Driving ``tideserve up`` / ``status`` / ``down`` as real processes in e2e tests."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from services.stack.state import StackState, read_state

__all__ = ["cli", "wait_running"]


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
