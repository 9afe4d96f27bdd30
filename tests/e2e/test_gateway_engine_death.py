"""An engine process SIGKILLed while requests wait on it before their first token (issue 15).

The gateway (in process, static fleet, no background tasks: it learns of the death only
from the failed requests) sends every request to the victim, a real ``tideserve engine``
process so slow (``--speedup 0.0005``) that its prefill cannot finish; once the victim holds
them all, a fast survivor joins the fleet and the victim is killed. Every request, streamed
or not, must then complete 200 with its full answer from the survivor: none is answered
502 or ends with an error event, since none had sent a byte to its client. Disaggregated
(SGLang protocol, decode engines that cannot prefill): the victim is the prefill half, the
decode engine answers 502 when its bootstrap peer dies, and the gateway must retry on the
surviving prefill rather than blame the decode (its only one).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from services.common.routing.types import Role
from services.common.scheduling import EndpointSpec, build_core
from services.scheduler.http import upstream
from services.scheduler.http.options import GatewayOptions
from services.scheduler.http.server import Gateway
from tests.helpers.engine_stack import Outcome, metric_total, stream_sse
from tests.helpers.ports import free_port
from tests.helpers.waits import eventually

pytestmark = pytest.mark.e2e

N = 4  # requests of each kind (streamed, whole)
MAX_TOKENS = 6


def _engine(port: int, state_dir: Path, speedup: float, role: str) -> subprocess.Popen[bytes]:
    argv = [
        sys.executable,
        "-c",
        "import sys; from services.engine.cli import main; sys.exit(main())",
        "--port",
        str(port),
        "--profile",
        "test",
        "--speedup",
        str(speedup),
        "--state-dir",
        str(state_dir),
        "--role",
        role,
        "--log-level",
        "WARNING",
    ]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


@pytest.fixture
def engines(tmp_path: Path) -> Iterator[Callable[[str, float, str], tuple[Any, str]]]:
    """Starts ``tideserve engine`` processes (name, speedup, role); stops them at the end."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(name: str, speedup: float, role: str) -> tuple[subprocess.Popen[bytes], str]:
        port = free_port()
        procs.append(_engine(port, tmp_path / name, speedup, role))
        return procs[-1], f"http://127.0.0.1:{port}"

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=30)


async def _held(s: aiohttp.ClientSession, url: str) -> int:
    """Requests the engine holds (running + queued)."""
    async with s.get(url + "/metrics") as r:
        text = await r.text()
    return int(
        metric_total(text, "sglang:num_running_reqs") + metric_total(text, "sglang:num_queue_reqs")
    )


@pytest.mark.parametrize(
    "disaggregated",
    [False, True],
    ids=["aggregated", "prefill-dies-under-its-decode"],
)
async def test_requests_on_an_engine_killed_before_their_first_token_complete_elsewhere(
    engines: Callable[[str, float, str], tuple[subprocess.Popen[bytes], str]],
    disaggregated: bool,
) -> None:
    """Disaggregated (SGLang protocol): the victim is the prefill half; the decode engine
    waits on its bootstrap room when it dies, and answers 502."""
    role: Role = "prefill" if disaggregated else "worker"
    engine_role = "prefill" if disaggregated else "aggregated"
    victim, victim_url = engines("victim", 0.0005, engine_role)
    _, survivor_url = engines("survivor", 50.0, engine_role)
    specs = [EndpointSpec("victim", victim_url, role=role)]
    urls = [victim_url, survivor_url]
    if disaggregated:
        _, decode_url = engines("decode", 50.0, "decode")
        specs.append(EndpointSpec("decode", decode_url, role="decode"))
        urls.append(decode_url)
    core = build_core(specs, perf_profile="test", decode_can_prefill=False)
    gw = Gateway(core, GatewayOptions(background=False, block_size=16, backoff_ms=1))
    server = TestServer(gw.app(), host="127.0.0.1")
    await server.start_server()
    base = str(server.make_url("")).rstrip("/")
    try:
        async with aiohttp.ClientSession() as s:
            for url in urls:
                await eventually(lambda u=url: upstream.probe(s, u, 2.0), within_s=120)  # type: ignore[misc]
            await gw.poll_load()

            def body(i: int) -> dict[str, Any]:
                return {
                    "model": "tideserve-sim",
                    "messages": [{"role": "user", "content": f"request {i} " + "w " * 200}],
                    "max_tokens": MAX_TOKENS,
                }

            async def whole(i: int) -> Outcome:
                async with s.post(base + "/v1/chat/completions", json=body(i)) as r:
                    return Outcome(status=r.status, body=await r.json(content_type=None))

            streamed = [
                asyncio.create_task(stream_sse(s, base + "/v1/chat/completions", body(i)))
                for i in range(N)
            ]
            wholes = [asyncio.create_task(whole(N + i)) for i in range(N)]
            tasks = [*streamed, *wholes]
            # Every request is on the victim: queued, or in its (endless) first step, which
            # may have taken any number of them (the engine batches what has arrived).
            await eventually(lambda: _count(s, victim_url, 2 * N), within_s=60)
            assert core.fleet.in_flight("victim") == 2 * N
            assert not any(t.done() for t in tasks)
            core.fleet.upsert(EndpointSpec("survivor", survivor_url, role=role))
            os.kill(victim.pid, signal.SIGKILL)
            victim.wait(timeout=30)
            outcomes = await asyncio.wait_for(asyncio.gather(*tasks), timeout=120)
    finally:
        await server.close()

    for i, o in enumerate(outcomes[:N]):
        assert (o.status, o.error, o.done, o.malformed) == (200, None, True, ""), (i, o)
        assert o.usage is not None and o.usage["completion_tokens"] == MAX_TOKENS, (i, o)
    for i, o in enumerate(outcomes[N:]):
        assert o.status == 200 and o.body is not None, (i, o)
        assert o.body["usage"]["completion_tokens"] == MAX_TOKENS, (i, o)
        assert o.body["choices"][0]["message"]["content"], (i, o)
    assert gw.metrics.value("tideserve_gateway_retries_total") >= 2 * N


async def _count(s: aiohttp.ClientSession, url: str, n: int) -> bool:
    return await _held(s, url) >= n
