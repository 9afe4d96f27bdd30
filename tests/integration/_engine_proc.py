"""A ``tideserve engine`` subprocess on a free port, for tests that need an engine publishing
to Redis (a separate process: its shutdown can never hold up the test's event loop)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp

from tests.helpers.ports import free_port


@contextlib.asynccontextmanager
async def engine_process(state_dir: Path, *args: str) -> AsyncIterator[str]:
    """Run ``tideserve engine --port <free> --profile test --speedup 50 ARGS...`` and yield
    its base URL once ``/health`` answers; SIGTERM (then SIGKILL) on exit."""
    async with engine_proc(state_dir, *args) as (url, _proc):
        yield url


@contextlib.asynccontextmanager
async def engine_proc(
    state_dir: Path, *args: str, port: int = 0
) -> AsyncIterator[tuple[str, asyncio.subprocess.Process]]:
    """:func:`engine_process` on ``port`` (0: a free one), yielding the process too (a test
    may kill it; on exit it is stopped only if still running)."""
    port = port or free_port()
    cmd = [
        sys.executable,
        "-m",
        "services.cli",
        "engine",
        "--port",
        str(port),
        "--profile",
        "test",
        "--speedup",
        "50",
        "--state-dir",
        str(state_dir),
        "--log-level",
        "WARNING",
        *args,
    ]
    await asyncio.to_thread(state_dir.mkdir, parents=True, exist_ok=True)
    log = state_dir / "engine.log"
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            *cmd, stdout=subprocess.DEVNULL, stderr=out, env=dict(os.environ)
        )
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as http:
            for _ in range(300):
                if proc.returncode is not None:
                    err = log.read_text(errors="replace")[-500:]
                    raise RuntimeError(f"engine exited {proc.returncode}: {err}")
                with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
                    async with http.get(url + "/health") as r:
                        if r.status == 200:
                            break
                await asyncio.sleep(0.05)
            else:
                raise RuntimeError("engine did not become healthy")
        yield url, proc
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                proc.kill()
                await proc.wait()
