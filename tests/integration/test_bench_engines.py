"""``tideserve bench`` against two real simulated engines (``tideserve engine`` processes)."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import BinaryIO

import aiohttp
import pytest

from services.bench.client import Api, BenchConfig, run_bench
from services.common.bench.traces import load_trace
from tests.helpers.ports import free_port

DATA = Path(__file__).resolve().parents[1] / "data"
ROOT = Path(__file__).resolve().parents[2]
SPEEDUP = 50.0


async def _healthy(url: str, proc: asyncio.subprocess.Process, log: Path, timeout_s: float) -> None:
    async with aiohttp.ClientSession() as session:
        for _ in range(int(timeout_s / 0.2)):
            if proc.returncode is not None:
                tail = (await asyncio.to_thread(log.read_text, errors="replace"))[-2000:]
                raise RuntimeError(f"engine exited {proc.returncode}: {tail}")
            with contextlib.suppress(aiohttp.ClientError):
                async with session.get(url + "/health") as resp:
                    if resp.status == 200:
                        return
            await asyncio.sleep(0.2)
    raise RuntimeError(f"engine at {url} not healthy after {timeout_s}s")


@pytest.fixture
async def engines(tmp_path: Path) -> AsyncIterator[list[str]]:
    procs: list[asyncio.subprocess.Process] = []
    logs: list[BinaryIO] = []
    urls: list[str] = []
    try:
        for i in range(2):
            port = free_port()
            args = [
                "-m", "services.cli", "engine",
                "--port", str(port), "--instance-id", f"bench-test-{i}",
                "--speedup", str(SPEEDUP), "--stream-interval", "4",
                "--state-dir", str(tmp_path / f"e{i}"),
            ]  # fmt: skip
            # A file, not a pipe: nobody reads a pipe, and a full one would stall the engine.
            logs.append((tmp_path / f"engine-{i}.log").open("wb"))
            procs.append(
                await asyncio.create_subprocess_exec(
                    sys.executable,
                    *args,
                    cwd=ROOT,
                    stdout=logs[-1],
                    stderr=asyncio.subprocess.STDOUT,
                )
            )
            urls.append(f"http://127.0.0.1:{port}")
        for i, (url, proc) in enumerate(zip(urls, procs, strict=True)):
            await _healthy(url, proc, tmp_path / f"engine-{i}.log", 60.0)
        yield urls
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.terminate()
        for proc in procs:
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        for f in logs:
            f.close()


@pytest.mark.parametrize(
    ("api", "template_tokens"), [("chat", 1), ("completions", 0)], ids=["chat", "completions"]
)
async def test_bench_against_two_simulated_engines(
    engines: list[str], api: Api, template_tokens: int
) -> None:
    trace = load_trace(DATA / "mooncake_conversation_head.jsonl")
    cfg = BenchConfig(
        targets=tuple(engines),
        api=api,
        speedup=SPEEDUP,
        max_requests=20,
        trace_time=True,
        timeout_s=120,
    )
    summary, results = await run_bench(cfg, trace)
    assert (summary["completed"], summary["failed"]) == (20, 0), summary["errors"]
    assert summary["targets"] == {engines[0]: {"completed": 10}, engines[1]: {"completed": 10}}
    # The engine generates exactly max_tokens (ignore_eos): counts match the trace.
    assert summary["output_length_mismatch"] == 0
    # Its chat template renders "user: <prompt>": one token more per request; completions
    # send the bare prompt.
    assert summary["prompt_tokens"] == sum(
        r.input_length + template_tokens for r in trace.requests[:20]
    )
    assert summary["cache_hit_ratio"] is not None
    assert all(r.ttft_s is not None and r.ttft_s > 0 for r in results)
    assert summary["time_base"] == "trace"
