"""sglang-router (PyPI ``sglang-router``, an off-the-shelf router) registers two simulated
engines and routes streamed chat completions to both.

sglang-router is not a project dependency: it is installed once into a throwaway venv under
the system temp dir, keyed by version, and reused by later runs. The test skips, saying why,
only when that install fails (e.g. no network to PyPI).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import aiohttp
import pytest

from tests.helpers.ports import free_port

pytestmark = pytest.mark.e2e

ROUTER_VERSION = "0.3.2"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def router_python() -> Path:
    """Python of a venv with sglang-router installed (cached across runs)."""
    venv = Path(tempfile.gettempdir()) / f"tideserve-sglang-router-{ROUTER_VERSION}"
    python = venv / "bin" / "python"
    probe = [str(python), "-c", "import sglang_router"]
    if python.exists() and subprocess.run(probe, capture_output=True).returncode == 0:
        return python
    partial = venv.with_name(venv.name + f".partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        subprocess.run(
            [sys.executable, "-m", "venv", str(partial)], check=True, capture_output=True
        )
        pip = [str(partial / "bin" / "python"), "-m", "pip", "install", "-q"]
        done = subprocess.run(
            [*pip, f"sglang-router=={ROUTER_VERSION}"], capture_output=True, text=True, timeout=600
        )
    except (subprocess.SubprocessError, OSError) as err:
        shutil.rmtree(partial, ignore_errors=True)
        pytest.skip(f"cannot create a venv for sglang-router: {err}")
    if done.returncode != 0:
        shutil.rmtree(partial, ignore_errors=True)
        tail = done.stderr.strip().splitlines()[-1:] or ["(no output)"]
        pytest.skip(f"pip install sglang-router=={ROUTER_VERSION} failed: {tail[0]}")
    # Console scripts keep the partial path in their shebang; we only run `python -m`.
    shutil.rmtree(venv, ignore_errors=True)
    partial.rename(venv)
    return python


class Procs:
    def __init__(self, logdir: Path) -> None:
        self.logdir = logdir
        self.procs: list[tuple[subprocess.Popen[bytes], BinaryIO, Path]] = []

    def start(self, name: str, args: list[str]) -> None:
        log = self.logdir / f"{name}.log"
        f = log.open("wb")
        proc = subprocess.Popen(args, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT)
        self.procs.append((proc, f, log))

    def check(self) -> None:
        for proc, _, log in self.procs:
            if proc.poll() is not None:
                tail = log.read_text(errors="replace")[-2000:]
                raise AssertionError(f"{proc.args[:4]} exited {proc.returncode}:\n{tail}")

    def stop(self) -> None:
        for proc, _, _ in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc, f, _ in self.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            f.close()


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    p = Procs(tmp_path)
    yield p
    p.stop()


async def _wait_ok(http: aiohttp.ClientSession, url: str, procs: Procs, timeout_s: float) -> Any:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while loop.time() < deadline:
        procs.check()
        try:
            async with http.get(url) as resp:
                if resp.status == 200:
                    return await resp.json(content_type=None)
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.2)
    raise AssertionError(f"{url} not ready after {timeout_s}s")


async def _chat(
    http: aiohttp.ClientSession, url: str, content: str, max_tokens: int
) -> dict[str, Any]:
    body = {
        "model": "tideserve-sim",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "stream": True,
    }
    chunks: list[Any] = []
    async with http.post(url + "/v1/chat/completions", json=body) as resp:
        assert resp.status == 200, await resp.text()
        async for raw in resp.content:
            line = raw.decode().strip()
            if line.startswith("data: "):
                chunks.append(line[6:])
    assert chunks[-1] == "[DONE]"
    parsed = [json.loads(c) for c in chunks[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in parsed if c["choices"])
    assert len(text.split()) == max_tokens
    usage: dict[str, Any] = parsed[-1]["usage"]
    return usage


def _requests_served(metrics: str) -> float:
    for line in metrics.splitlines():
        if line.startswith("sglang:num_requests_total{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError("sglang:num_requests_total missing")


async def test_sglang_router_routes_streamed_chat_to_both_engines(
    router_python: Path, procs: Procs, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    engines = [f"http://127.0.0.1:{free_port()}" for _ in range(2)]
    for i, url in enumerate(engines):
        procs.start(
            f"engine-{i}",
            [
                sys.executable, "-m", "services.cli", "engine",
                "--port", url.rsplit(":", 1)[1], "--instance-id", f"e2e-{i}",
                "--profile", "test", "--speedup", "1", "--stream-interval", "8",
                "--state-dir", str(tmp_path / f"state-{i}"),
            ],
        )  # fmt: skip
    for url in engines:
        await _wait_ok(http, url + "/health", procs, 60)
    router = f"http://127.0.0.1:{free_port()}"
    procs.start(
        "router",
        [
            str(router_python), "-m", "sglang_router.launch_router",
            "--host", "127.0.0.1", "--port", router.rsplit(":", 1)[1],
            "--worker-urls", *engines, "--policy", "cache_aware", "--log-level", "warn",
            # its metrics exporter defaults to port 29000: a second run beside this one
            # (or anything else on 29000) would make the router exit
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
        ],
    )  # fmt: skip
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 60
    workers: list[Any] = []
    while loop.time() < deadline:
        info = await _wait_ok(http, router + "/workers", procs, 60)
        workers = [w for w in info.get("workers", []) if w.get("is_healthy")]
        if len(workers) == 2:
            break
        await asyncio.sleep(0.3)
    assert sorted(w["url"] for w in workers) == sorted(engines)
    assert all(os.path.isdir(w["metadata"]["model_path"]) for w in workers)  # noqa: ASYNC240

    # Concurrent streams with unrelated prompts: cache-aware routing falls back to the least
    # loaded worker, so both engines get work.
    prompts = [" ".join(f"p{i}w{j}" for j in range(100)) for i in range(8)]
    usages = await asyncio.gather(*(_chat(http, router, p, 150) for p in prompts))
    assert all(u["completion_tokens"] == 150 for u in usages)
    served = []
    for url in engines:
        async with http.get(url + "/metrics") as resp:
            served.append(_requests_served(await resp.text()))
    assert sum(served) == 8 and all(n > 0 for n in served), served

    # The same long prompt again: the router sends it where its prefix is cached.
    again = await _chat(http, router, prompts[0], 4)
    assert again["prompt_tokens_details"]["cached_tokens"] >= 64


async def test_sglang_router_pd_mode_uses_the_bootstrap_handshake(
    router_python: Path, procs: Procs, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    prefill, decode = (f"http://127.0.0.1:{free_port()}" for _ in range(2))
    bootstrap = free_port()
    common = ["--profile", "test", "--speedup", "5"]
    procs.start(
        "prefill",
        [
            sys.executable, "-m", "services.cli", "engine", "--role", "prefill",
            "--port", prefill.rsplit(":", 1)[1], "--bootstrap-port", str(bootstrap),
            "--state-dir", str(tmp_path / "p"), *common,
        ],
    )  # fmt: skip
    procs.start(
        "decode",
        [
            sys.executable, "-m", "services.cli", "engine", "--role", "decode",
            "--port", decode.rsplit(":", 1)[1], "--state-dir", str(tmp_path / "d"), *common,
        ],
    )  # fmt: skip
    for url in (prefill, decode):
        await _wait_ok(http, url + "/health", procs, 60)
    router = f"http://127.0.0.1:{free_port()}"
    procs.start(
        "router",
        [
            str(router_python), "-m", "sglang_router.launch_router",
            "--host", "127.0.0.1", "--port", router.rsplit(":", 1)[1], "--pd-disaggregation",
            "--prefill", prefill, str(bootstrap), "--decode", decode, "--log-level", "warn",
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
        ],
    )  # fmt: skip
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 60
    while loop.time() < deadline:
        info = await _wait_ok(http, router + "/workers", procs, 60)
        if len([w for w in info.get("workers", []) if w.get("is_healthy")]) == 2:
            break
        await asyncio.sleep(0.3)
    usage = await _chat(http, router, " ".join(f"q{j}" for j in range(200)), 12)
    assert usage["completion_tokens"] == 12
    texts = []
    for url in (prefill, decode):
        async with http.get(url + "/metrics") as resp:
            texts.append(await resp.text())
    p_gen, d_gen = (
        next(
            float(x.rsplit(" ", 1)[1])
            for x in t.splitlines()
            if x.startswith("sglang:generation_tokens_total{")
        )
        for t in texts
    )
    # The prefill generated the first token only; the decode produced all 12 (the first
    # arrives with the KV).
    assert (p_gen, d_gen) == (1.0, 12.0)
