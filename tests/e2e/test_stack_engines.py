"""`tideserve up` with simulated engines behind the gateway, as real processes (issue 5).

Each stack runs on Postgres/Redis from the session fixtures (no embedded servers per stack),
the four services and the engines on ephemeral ports that were free a moment ago (written into
a config file, never a design default), the small 'test' performance profile and a small KV
cache. Requests go through the scheduler's OpenAI-compatible gateway only.

- aggregated (2 engines): streamed and non-streamed chat, cached tokens on a repeated long
  prompt, /v1/models, `status` lists the engines;
- P/D (1 prefill + 1 decode): streamed completions through the SGLang bootstrap hand-off
  (the prefill engine really computed the prompt);
- an engine SIGKILLed mid-run: every request completes, or - only if it had already started
  streaming - ends with a well-formed SSE error event; nothing hangs; requests that had not
  started streaming are not lost; new requests still succeed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from services.stack.procs import ProcRef, is_alive, stop_processes
from services.stack.state import ProcEntry, StackState, read_state
from tests.helpers.ports import free_ports
from tests.helpers.stack import cli, status_json, wait_running

pytestmark = pytest.mark.e2e

START_TIMEOUT_S = 180.0  # 2 shared cores: the services can be slow to import
REQUEST_TIMEOUT_S = 60.0  # a client timeout: no request may hang
SERVICES = ("scheduler", "kvmeta", "autoscaler", "telemetry")


@dataclass
class RunningStack:
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
def _start_stack(
    postgres_url: str,
    redis_url: str,
    n_engines: int,
    engine_flags: list[str],
    *,
    kv_blocks: int = 512,
    health_interval_s: float = 0.5,
) -> Iterator[RunningStack]:
    state_dir = Path(tempfile.mkdtemp(prefix="tseng-"))
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
    config = state_dir / "tideserve.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                **layout,
                "stack": {"engine_ports": [next(ports) for _ in range(n_engines)]},
                "log_format": "text",
            }
        )
    )
    up = subprocess.Popen(
        [
            *cli(),
            "up",
            "--state-dir",
            str(state_dir),
            "--config",
            str(config),
            "--postgres-url",
            postgres_url,
            "--redis-url",
            redis_url,
            "--start-timeout",
            str(START_TIMEOUT_S),
            "--engine-profile",
            "test",
            "--engine-kv-blocks",
            str(kv_blocks),
            *engine_flags,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        state = wait_running(up, state_dir, START_TIMEOUT_S + 30)
        assert state.gateway_url == f"http://127.0.0.1:{http_port}/v1"
        yield RunningStack(
            state_dir,
            up,
            f"http://127.0.0.1:{http_port}",
            deployment,
            {p.name: p for p in state.engines()},
        )
        down = subprocess.run(
            [*cli(), "down", "--state-dir", str(state_dir)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert down.returncode == 0, down.stdout + down.stderr
        out, _ = up.communicate(timeout=60)
        assert f"gateway (OpenAI API): http://127.0.0.1:{http_port}/v1" in out
        for name, entry in {p.name: p for p in state.engines()}.items():
            assert f"{name:<11} {entry.role} engine {entry.url}" in out
        assert [p.name for p in state.processes if is_alive(p.ref)] == []
        assert read_state(state_dir) is None
    finally:
        if up.poll() is None:
            up.send_signal(signal.SIGTERM)
            try:
                up.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                up.kill()
        leftover = read_state(state_dir)
        if leftover is not None:
            stop_processes([leftover.up.ref, *(p.ref for p in leftover.processes)], 5.0)
        shutil.rmtree(state_dir, ignore_errors=True)


def _words(n: int, salt: str) -> str:
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


async def _stream(
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


@pytest.fixture(scope="module")
def aggregated(postgres_url: str, redis_url: str) -> Iterator[RunningStack]:
    with _start_stack(
        postgres_url, redis_url, 2, ["--engines", "2", "--engine-speedup", "20"]
    ) as stack:
        yield stack


async def test_aggregated_chat_streamed_non_streamed_models_and_cache(
    aggregated: RunningStack, redis_url: str
) -> None:
    assert {n: e.role for n, e in aggregated.engines.items()} == {
        "engine-1": "aggregated",
        "engine-2": "aggregated",
    }
    base = aggregated.gateway
    async with aiohttp.ClientSession() as s:
        async with s.get(base + "/v1/models", timeout=aiohttp.ClientTimeout(total=30)) as r:
            assert r.status == 200
            models = [m["id"] for m in (await r.json())["data"]]
        assert models == ["tideserve-sim"]
        msg = {"model": models[0], "messages": [{"role": "user", "content": "hello there"}]}

        async with s.post(
            base + "/v1/chat/completions",
            json={**msg, "max_tokens": 8},
            timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S),
        ) as r:
            assert r.status == 200, await r.text()
            body = await r.json()
        assert body["object"] == "chat.completion"
        assert body["choices"][0]["message"]["content"]
        assert 0 < body["usage"]["completion_tokens"] <= 8

        streamed = await _stream(
            s,
            base + "/v1/chat/completions",
            {**msg, "max_tokens": 12, "stream_options": {"include_usage": True}},
        )
        assert streamed.status == 200
        assert streamed.error is None and not streamed.malformed and streamed.done
        assert streamed.chunks > 1 and streamed.text
        assert streamed.usage is not None and 0 < streamed.usage["completion_tokens"] <= 12

        # A long prompt twice: the second lands where the first left its KV blocks.
        long_msg = {
            "model": models[0],
            "messages": [{"role": "user", "content": _words(600, uuid.uuid4().hex[:6])}],
            "max_tokens": 4,
        }
        cached = []
        for _ in range(2):
            async with s.post(
                base + "/v1/chat/completions",
                json=long_msg,
                timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S),
            ) as r:
                assert r.status == 200, await r.text()
                usage = (await r.json())["usage"]
            cached.append(usage.get("prompt_tokens_details", {}).get("cached_tokens", 0))
        assert cached[0] == 0
        assert cached[1] >= 512, cached  # most of the 600-word prompt, in whole 64-token blocks

        # The stack points the gateway at its kvmeta: once kvmeta has indexed the engines'
        # KV events, the gateway's precise-prefix lookups are answered.
        ok = 0.0
        deadline = time.monotonic() + 20
        while ok == 0 and time.monotonic() < deadline:
            async with s.post(
                base + "/v1/chat/completions",
                json=long_msg,
                timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S),
            ) as r:
                assert r.status == 200, await r.text()
            async with s.get(base + "/metrics", timeout=aiohttp.ClientTimeout(total=30)) as r:
                ok = _metric_with(
                    await r.text(), "tideserve_gateway_kvmeta_lookups_total", 'result="ok"'
                )
            if ok == 0:
                await asyncio.sleep(0.5)
        assert ok > 0, "the gateway never got a MatchPrefix answer from the stack's kvmeta"

    # the engines publish to the stack's Redis, under the scheduler's deployment
    import redis.asyncio as aioredis

    rc = aioredis.Redis.from_url(redis_url)
    streams = [f"ts:kv:{aggregated.deployment}", f"ts:load:{aggregated.deployment}"]
    try:
        lengths = [0, 0]
        deadline = time.monotonic() + 20  # events are flushed in the background
        while 0 in lengths and time.monotonic() < deadline:
            lengths = [await rc.xlen(name) for name in streams]
            await asyncio.sleep(0.1)
    finally:
        await rc.aclose()
    assert 0 not in lengths, dict(zip(streams, lengths, strict=True))

    code, report = await asyncio.to_thread(status_json, aggregated.state_dir)
    assert code == 0, report
    assert report["gateway_url"] == base + "/v1"
    assert {e["name"]: (e["role"], e["health"], e["alive"]) for e in report["engines"]} == {
        "engine-1": ("aggregated", "SERVING", True),
        "engine-2": ("aggregated", "SERVING", True),
    }
    assert {s["name"] for s in report["services"]} == set(SERVICES)


def _metric_with(text: str, name: str, label: str) -> float:
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name + "{") and label in line
    )


def _metric(text: str, name: str) -> float:
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name + "{") or line.startswith(name + " ")
    )


async def test_pd_streamed_completions_through_bootstrap(postgres_url: str, redis_url: str) -> None:
    with _start_stack(
        postgres_url,
        redis_url,
        2,
        ["--prefill", "1", "--decode", "1", "--engine-speedup", "20"],
    ) as stack:
        assert {n: e.role for n, e in stack.engines.items()} == {
            "prefill-1": "prefill",
            "decode-1": "decode",
        }
        prefill_url = stack.engines["prefill-1"].url
        decode_url = stack.engines["decode-1"].url
        async with aiohttp.ClientSession() as s:
            # long enough (> the P/D decider's 512 uncached tokens) to be disaggregated
            prompts = [_words(800, f"{uuid.uuid4().hex[:6]}") for _ in range(3)]
            chat = {"messages": [{"role": "user", "content": prompts[0]}]}
            outcomes = [
                await _stream(
                    s,
                    stack.gateway + "/v1/chat/completions",
                    {"model": "tideserve-sim", "max_tokens": 16, **chat},
                )
            ]
            outcomes += await asyncio.gather(
                *(
                    _stream(
                        s,
                        stack.gateway + "/v1/completions",
                        {"model": "tideserve-sim", "prompt": p, "max_tokens": 16},
                    )
                    for p in prompts[1:]
                )
            )
            for o in outcomes:
                assert o.status == 200, o.body
                assert o.error is None and not o.malformed and o.done, o
                assert o.chunks > 1
            metrics = {}
            for name, url in (("prefill", prefill_url), ("decode", decode_url)):
                async with s.get(f"{url}/metrics") as r:
                    metrics[name] = await r.text()
        # SGLang-style P/D (the stack's default pd_protocol): a decode engine never computes a
        # prompt alone, so the prefill engine computed all three prompts (800 words each) and
        # the decode engine generated the tokens.
        assert _metric(metrics["prefill"], "sglang:prompt_tokens_total") >= 3 * 800
        assert _metric(metrics["decode"], "sglang:generation_tokens_total") >= 3 * 2


@dataclass
class KillReport:
    completed: int = 0
    broken_after_start: int = 0
    lost_before_start: list[str] = field(default_factory=list)
    malformed: list[str] = field(default_factory=list)


async def test_engine_killed_mid_run_loses_no_request_that_had_not_started(
    postgres_url: str, redis_url: str
) -> None:
    with _start_stack(
        postgres_url,
        redis_url,
        2,
        # one prompt chunk per step: long prompts queue on the engine before they stream
        ["--engines", "2", "--engine-speedup", "1", "--engine-arg=--max-batched-tokens=2048"],
        kv_blocks=2048,  # 20 long prompts fit on the survivor
        health_interval_s=5.0,  # the gateway learns of the death from failed requests
    ) as stack:
        victim = stack.engines["engine-2"]
        victim_ref = ProcRef(victim.name, victim.pid, victim.create_time)
        started = StartCounter(4)
        url = stack.gateway + "/v1/chat/completions"

        async def one(i: int, s: aiohttp.ClientSession) -> Outcome:
            await asyncio.sleep(0.04 * i)  # staggered: some start after the kill
            body = {
                "model": "tideserve-sim",
                # long prompts: prefill takes a while, so requests wait on the victim
                # without having streamed anything when it dies
                "messages": [{"role": "user", "content": _words(2500, f"k{i}x")}],
                "max_tokens": 400,
            }
            try:
                return await _stream(s, url, body, started)
            except TimeoutError:
                return Outcome(malformed="client timeout: the request hung")

        async def killer(s: aiohttp.ClientSession) -> tuple[int, int]:
            """SIGKILL the victim once 4 requests stream and it holds queued requests (not
            started, certainly not streaming). Returns (streaming, queued on the victim)."""
            await started.reached.wait()
            deadline = time.monotonic() + 20
            while True:
                async with s.get(f"{victim.url}/metrics") as r:
                    queued = int(_metric(await r.text(), "sglang:num_queue_reqs"))
                if queued >= 1 or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.01)
            os.kill(victim.pid, signal.SIGKILL)
            return started.count, queued

        async with aiohttp.ClientSession() as s:
            kill = asyncio.create_task(killer(s))
            outcomes = await asyncio.gather(*(one(i, s) for i in range(20)))
            await asyncio.wait_for(kill, 5)
            report = KillReport()
            for i, o in enumerate(outcomes):
                if o.malformed:
                    report.malformed.append(f"#{i}: {o.malformed}")
                elif o.status == 200 and o.done and o.error is None and o.chunks > 0:
                    report.completed += 1
                elif o.status == 200 and o.chunks > 0 and o.error is not None and o.done:
                    assert o.error["type"] == "server_error" and o.error["message"], o.error
                    report.broken_after_start += 1
                else:
                    report.lost_before_start.append(
                        f"#{i}: HTTP {o.status} chunks={o.chunks} error={o.error} body={o.body}"
                    )
            streaming, queued = kill.result()
            print(f"engine kill: {report}; streaming at the kill {streaming}, queued on the "
                  f"victim {queued}")  # fmt: skip
            assert not is_alive(victim_ref)
            assert report.malformed == [], report
            assert report.lost_before_start == [], report
            assert report.broken_after_start >= 1, report  # the kill hit streams in flight
            # ... and requests queued on the victim, not started: they completed elsewhere
            assert queued >= 1, "the victim never held a queued request: nothing was tested"
            assert report.completed + report.broken_after_start == 20

            # afterwards: new requests still succeed (on the surviving engine)
            after = await asyncio.gather(
                *(
                    _stream(
                        s,
                        url,
                        {
                            "model": "tideserve-sim",
                            "messages": [{"role": "user", "content": f"after {i}"}],
                            "max_tokens": 8,
                        },
                    )
                    for i in range(4)
                )
            )
            assert all(o.status == 200 and o.done and o.error is None for o in after), after

        # the stack keeps running without the dead engine; status says so
        assert stack.up.poll() is None
        code, status = await asyncio.to_thread(status_json, stack.state_dir)
        assert code == 1, status
        engines = {e["name"]: (e["alive"], e["health"]) for e in status["engines"]}
        assert engines == {"engine-1": (True, "SERVING"), "engine-2": (False, "UNREACHABLE")}
