"""Requests through `tideserve up` come back as windows and sessions from telemetry (issue 10).

The gateway writes a RequestRecord per request to ``ts:requests``; the stack's telemetry
service consumes them (consumer group), stores them in Postgres and updates its windows;
``tideserve get windows --json`` and ``tideserve get session`` read them back over gRPC, with
the telemetry address taken from the stack's state file.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import uuid
from typing import Any

import aiohttp
import pytest

from tests.helpers.ports import free_ports
from tests.helpers.stack import RunningStack, cli, running_stack
from tests.helpers.waits import eventually

pytestmark = pytest.mark.e2e

SERVICES = ("scheduler", "kvmeta", "autoscaler", "telemetry")
REQUESTS = 6


def _config(deployment: str) -> dict[str, Any]:
    ports = iter(free_ports(8))
    layout: dict[str, Any] = {s: {"grpc_port": next(ports), "metrics_port": 0} for s in SERVICES}
    layout["scheduler"].update(http_port=next(ports), deployment=deployment)
    layout["kvmeta"]["metadata_http_port"] = next(ports)
    layout["stack"] = {"engine_ports": [next(ports)], "gateway_grpc_ports": [next(ports)]}
    return layout


def _get(stack: RunningStack, *args: str) -> tuple[int, str, str]:
    res = subprocess.run(
        [*cli(), "get", *args, "--state-dir", str(stack.state_dir)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return res.returncode, res.stdout, res.stderr


async def test_requests_through_the_stack_read_back_as_windows_and_a_session(
    postgres_url: str, redis_url: str
) -> None:
    dep = f"e2e-tel-{uuid.uuid4().hex[:8]}"
    config = _config(dep)
    flags = ["--engines", "1", "--engine-profile", "test", "--engine-speedup", "20"]
    with running_stack(config, flags, postgres_url=postgres_url, redis_url=redis_url) as stack:
        base = f"http://127.0.0.1:{config['scheduler']['http_port']}"
        session = f"{dep}-agent"
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:
            for i in range(REQUESTS):
                body = {"model": "tideserve-sim", "prompt": f"turn {i} " * 50, "max_tokens": 8}
                headers = {"X-Tideserve-Session": session, "X-Tideserve-Class": "interactive"}
                async with http.post(base + "/v1/completions", json=body, headers=headers) as r:
                    assert r.status == 200, await r.text()

        window: dict[str, Any] = {}

        async def all_counted() -> bool:
            code, out, err = await asyncio.to_thread(
                _get, stack, "windows", "--deployment", dep, "--last", "5m", "--json"
            )
            assert code == 0, err
            window.update(json.loads(out))
            return int(window["total"].get("requests", 0)) == REQUESTS

        await eventually(all_counted, within_s=60)
        total = window["total"]
        assert total["deployment"] == dep
        assert float(total["ttft_ms"]["p50"]) > 0 and float(total["request_rate_rps"]) > 0
        assert [(s["role"], s["slo_class"]) for s in window["slices"]] == [
            ("worker", "interactive")
        ]
        assert window["source"] == "memory"

        code, out, err = await asyncio.to_thread(_get, stack, "session", session, "--json")
        assert code == 0, err
        turns = json.loads(out)["turns"]
        assert len(turns) == REQUESTS
        arrivals = [int(t["arrival_ms"]) for t in turns]
        assert arrivals == sorted(arrivals)
        code, out, _ = await asyncio.to_thread(_get, stack, "session", session)
        assert code == 0 and f"session {session}: {REQUESTS} turns" in out
