"""`tideserve gateway` as a process in front of an in-process simulated engine."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from tests.helpers.engines import EngineFleet
from tests.helpers.ports import free_port


@pytest.fixture
async def engine_url(tmp_path: Path) -> AsyncIterator[str]:
    fleet = EngineFleet(tmp_path, profile="test", speedup=50.0)
    _, url = await fleet.start()
    yield url
    await fleet.close()


async def test_gateway_process_serves_and_stops_on_sigterm(engine_url: str, tmp_path: Path) -> None:
    port = free_port()
    err = (tmp_path / "gw.err").open("wb")
    proc = subprocess.Popen(  # noqa: ASYNC220  (Popen does not block; waits go to a thread)
        [
            sys.executable,
            "-m",
            "services.cli",
            "gateway",
            "--port",
            str(port),
            "--endpoints",
            engine_url,
            "--profile",
            "least_load",
        ],
        stdout=subprocess.DEVNULL,
        stderr=err,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
            for _ in range(300):
                assert proc.poll() is None, (tmp_path / "gw.err").read_text()
                try:
                    async with http.get(url + "/v1/models") as r:
                        if r.status == 200 and (await r.json())["data"]:
                            break
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.1)
            body = {"model": "tideserve-sim", "prompt": "hello world", "max_tokens": 3}
            async with http.post(url + "/v1/completions", json=body) as r:
                assert r.status == 200 and (await r.json())["usage"]["completion_tokens"] == 3
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(proc.wait, 30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        err.close()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "no engines"),
        (["--endpoints", "ftp://x"], "expected an http(s) URL"),
        (["--endpoints", "http://a:1", "--profile", "nope"], "unknown profile 'nope'"),
        (["--endpoints", "http://a:1", "http://a:1"], "listed twice"),
    ],
    ids=["no-engines", "bad-url", "bad-profile", "duplicate"],
)
def test_gateway_cli_bad_arguments_exit_2_with_one_line(args: list[str], message: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "services.cli", "gateway", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0]
