"""`tideserve gateway` as a process in front of an in-process simulated engine (and, for
precise prefix data, an in-process kvmeta on a real Redis)."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import redis.asyncio as aioredis

from tests.helpers.engines import EngineFleet
from tests.helpers.kvmeta import serve_kvmeta
from tests.helpers.ports import free_port


@pytest.fixture
async def engine_url(tmp_path: Path) -> AsyncIterator[str]:
    fleet = EngineFleet(tmp_path, profile="test", speedup=50.0)
    _, url = await fleet.start()
    yield url
    await fleet.close()


def _text(path: Path) -> str:
    return path.read_text()


def _start_gateway(port: int, err: Path, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "services.cli", "gateway", "--port", str(port), *args],
        stdout=subprocess.DEVNULL,
        stderr=err.open("wb"),
    )


async def _wait_serving(
    http: aiohttp.ClientSession, url: str, proc: subprocess.Popen[bytes], err: Path
) -> None:
    for _ in range(300):
        assert proc.poll() is None, _text(err)
        try:
            async with http.get(url + "/v1/models") as r:
                if r.status == 200 and (await r.json())["data"]:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.1)
    raise AssertionError("the gateway did not serve in 30 s")


async def _stop(proc: subprocess.Popen[bytes]) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return await asyncio.to_thread(proc.wait, 30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


async def test_gateway_process_serves_and_stops_on_sigterm(engine_url: str, tmp_path: Path) -> None:
    port, err = free_port(), tmp_path / "gw.err"
    proc = _start_gateway(port, err, "--endpoints", engine_url, "--profile", "least_load")
    try:
        url = f"http://127.0.0.1:{port}"
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
            await _wait_serving(http, url, proc, err)
            body = {"model": "tideserve-sim", "prompt": "hello world", "max_tokens": 3}
            async with http.post(url + "/v1/completions", json=body) as r:
                assert r.status == 200 and (await r.json())["usage"]["completion_tokens"] == 3
    finally:
        assert await _stop(proc) == 0


def _lookups(metrics: str) -> dict[str, float]:
    out = {}
    for line in metrics.splitlines():
        if line.startswith("tideserve_gateway_kvmeta_lookups_total{"):
            key = line.split('result="', 1)[1].split('"', 1)[0]
            out[key] = float(line.rsplit(" ", 1)[1])
    return out


@pytest.mark.parametrize("with_redis", [False, True], ids=["kvmeta", "redis-and-kvmeta"])
async def test_gateway_process_asks_kvmeta(
    engine_url: str, tmp_path: Path, redis_url: str, with_redis: bool
) -> None:
    """The gateway's kvmeta channel works from the process: it starts (with Redis too) and its
    MatchPrefix lookups are answered, not counted as errors."""
    redis = aioredis.Redis.from_url(redis_url)
    prefix = f"t{uuid.uuid4().hex[:8]}"
    port, err = free_port(), tmp_path / "gw.err"
    try:
        async with serve_kvmeta(redis, prefix) as (address, _):
            extra = ["--redis-url", redis_url, "--stream-prefix", prefix] if with_redis else []
            proc = _start_gateway(
                port, err, "--endpoints", engine_url, "--kvmeta-address", address, *extra
            )
            try:
                url = f"http://127.0.0.1:{port}"
                async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
                    await _wait_serving(http, url, proc, err)
                    prompt = " ".join(f"w{i}" for i in range(200))  # 3 blocks of 64
                    body = {"model": "tideserve-sim", "prompt": prompt, "max_tokens": 2}
                    async with http.post(url + "/v1/completions", json=body) as r:
                        assert r.status == 200, await r.text()
                    async with http.get(url + "/metrics") as r:
                        counts = _lookups(await r.text())
            finally:
                assert await _stop(proc) == 0, _text(err)
    finally:
        await redis.aclose()
    assert counts.get("calls") == 1, counts
    assert counts.get("errors") == 0 and counts.get("ok", 0) + counts.get("unknown", 0) == 1, counts


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
