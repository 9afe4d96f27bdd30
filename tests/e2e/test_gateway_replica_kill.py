"""Gateway replica killed (affinity kept): two gateway processes share routed prefixes
and in-flight load through Redis in front of three simulated engines. Multi-turn sessions
through replica A spread over the engines and stick to them; A is SIGKILLed; the next
turns through replica B land on the same engines, served from their prefix caches.

Which engine served a turn comes from the request records both replicas publish on
``{prefix}:requests``. Without sharing, B would send every session to its tie-break
winner, so at least two of the three sessions would miss their cache.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis
import yaml
from tideserve.v1 import events_pb2

from services.common.streams import decode_entry
from tests.helpers.ports import free_port, free_ports

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
TIDESERVE = Path(sys.executable).parent / "tideserve"
SESSIONS = 3


class Procs:
    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(
        self, name: str, argv: list[str], env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        with open(self.logs / f"{name}.log", "wb") as log:
            p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
        self.procs[name] = p
        return p

    def log(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text(errors="replace")[-3000:]

    def stop_all(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs.values():
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    ps = Procs(tmp_path)
    try:
        yield ps
    finally:
        ps.stop_all()


async def wait_http(http: aiohttp.ClientSession, url: str, procs: Procs, name: str) -> None:
    for _ in range(300):
        p = procs.procs[name]
        if p.poll() is not None:
            raise AssertionError(f"{name} exited {p.returncode}:\n{procs.log(name)}")
        try:
            async with http.get(url, timeout=aiohttp.ClientTimeout(total=1)) as r:
                if r.status == 200:
                    return
        except (aiohttp.ClientError, TimeoutError):
            pass
        await asyncio.sleep(0.1)
    raise AssertionError(f"{name} not ready at {url}:\n{procs.log(name)}")


def gateway_config(path: Path, **scheduler: Any) -> Path:
    path.write_text(yaml.safe_dump({"scheduler": scheduler}))
    return path


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url, decode_responses=False)
    yield client
    await client.aclose()


async def records(redis: aioredis.Redis, prefix: str) -> list[events_pb2.RequestRecord]:
    entries = await redis.xrange(f"{prefix}:requests")
    return [decode_entry(f, events_pb2.RequestRecord) for _, f in entries]


@pytest.mark.parametrize("share", [True, False], ids=["shared", "control-not-shared"])
async def test_gateway_replica_killed_affinity_kept(
    procs: Procs, redis_url: str, redis: aioredis.Redis, tmp_path: Path, share: bool
) -> None:
    prefix = f"e2e{uuid.uuid4().hex[:8]}"
    dep = "chat"
    engines = []
    for i in range(3):
        port = free_port()
        procs.start(
            f"engine{i}",
            [str(TIDESERVE), "engine", "--port", str(port), "--profile", "test",
             "--speedup", "2", "--block-size", "16", "--state-dir", str(tmp_path / f"e{i}"),
             "--log-level", "WARNING"],
        )  # fmt: skip
        engines.append(f"http://127.0.0.1:{port}")
    # Replica A is the scheduler service (YAML settings), replica B the standalone verb.
    a_port, b_port = free_ports(2)
    gw_ports = {"A": a_port, "B": b_port}
    cfg = gateway_config(
        tmp_path / "gwA.yaml",
        http_port=gw_ports["A"],
        grpc_port=0,
        metrics_port=0,
        redis_url=redis_url,
        stream_prefix=prefix,
        deployment=dep,
        endpoints=engines,
        block_size=16,
        perf_profile="test",
        replica_id="A",
        share_state=share,
        share_heartbeat_s=0.2,
        log_level="WARNING",
        state_dir=str(tmp_path / "gwA"),
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDESERVE_")}
    procs.start("A", [sys.executable, "-m", "services.scheduler", "--config", str(cfg)], env)
    procs.start(
        "B",
        [str(TIDESERVE), "gateway", "--port", str(gw_ports["B"]), "--endpoints", *engines,
         "--block-size", "16", "--perf-profile", "test", "--redis-url", redis_url,
         "--stream-prefix", prefix, "--deployment", dep, "--replica-id", "B",
         *(["--share-state"] if share else [])],
        env,
    )  # fmt: skip
    url = {n: f"http://127.0.0.1:{p}" for n, p in gw_ports.items()}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
        for i, e in enumerate(engines):
            await wait_http(http, e + "/health", procs, f"engine{i}")
        for n in ("A", "B"):
            await wait_http(http, url[n] + "/health", procs, n)
        await asyncio.sleep(1.0)  # both gateways probed and scraped the engines once

        prompts = [
            " ".join(f"s{s}w{i}" for i in range(320)) for s in range(SESSIONS)
        ]  # 20 blocks each, distinct per session

        async def turn(gw: str, s: int, extra: str) -> dict[str, Any]:
            prompts[s] += " " + extra
            body = {"model": "tideserve-sim", "prompt": prompts[s], "max_tokens": 16}
            headers = {"X-Tideserve-Session": f"sess{s}"}
            async with http.post(url[gw] + "/v1/completions", json=body, headers=headers) as r:
                data: dict[str, Any] = await r.json()
                assert r.status == 200, data
                prompts[s] += " " + data["choices"][0]["text"]
                return data

        # Turns 1 and 2 through A, the sessions concurrently (A spreads them by load).
        await asyncio.gather(*(turn("A", s, "hello") for s in range(SESSIONS)))
        second = await asyncio.gather(*(turn("A", s, "and then") for s in range(SESSIONS)))
        assert all(d["usage"]["prompt_tokens_details"]["cached_tokens"] > 0 for d in second)

        # Every pick of A reached the routed stream before A dies.
        for _ in range(100):
            if not share or await redis.xlen(f"{prefix}:routed:{dep}") >= 2 * SESSIONS:
                break
            await asyncio.sleep(0.05)
        assert await redis.xlen(f"{prefix}:routed:{dep}") == (2 * SESSIONS if share else 0)
        await asyncio.sleep(0.5)  # B's reader applies entries as they arrive

        procs.procs["A"].send_signal(signal.SIGKILL)
        procs.procs["A"].wait(timeout=10)

        third = [await turn("B", s, "finally") for s in range(SESSIONS)]
        for _ in range(100):
            if len(await records(redis, prefix)) >= 3 * SESSIONS:
                break
            await asyncio.sleep(0.05)

    recs = await records(redis, prefix)
    by_session: dict[str, list[events_pb2.RequestRecord]] = {}
    for r in recs:
        by_session.setdefault(r.session_id, []).append(r)
    a_engines = {s: by_session[f"sess{s}"][0].decode_instance for s in range(SESSIONS)}
    # Precondition: A spread the sessions (else B's tie-break could look like affinity).
    assert len(set(a_engines.values())) >= 2, a_engines
    if not share:  # B alone does not know where A's sessions live
        misses = [s for s in range(SESSIONS) if by_session[f"sess{s}"][2].cached_tokens == 0]
        assert misses, [(t.decode_instance, t.cached_tokens) for t in recs]
        return
    for s in range(SESSIONS):
        turns = by_session[f"sess{s}"]
        assert len(turns) == 3, [(t.decode_instance, t.cached_tokens) for t in turns]
        assert {t.decode_instance for t in turns} == {a_engines[s]}, (s, a_engines)
        assert turns[2].cached_tokens > 0 and turns[2].predicted_cached_tokens > 0
        assert third[s]["usage"]["prompt_tokens_details"]["cached_tokens"] == turns[2].cached_tokens
