"""Helpers shared by the data-plane benchmarks (``dataplane_*.py``)."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import aiohttp

from benchmarks._harness import ProcGroup, free_port, http_get

__all__ = ["pct", "start_metadata", "streamed", "wait_metadata"]


def wait_metadata(url: str, group: ProcGroup, timeout_s: float = 120.0) -> None:
    """Until the Mooncake metadata endpoint ``url`` answers (404 for an unknown key)."""
    deadline = time.monotonic() + timeout_s
    while http_get(f"{url}?key=probe")[0] != 404:
        group.check()
        if time.monotonic() > deadline:
            raise RuntimeError(f"the metadata endpoint {url} did not start")
        time.sleep(0.05)


def start_metadata(group: ProcGroup) -> str:
    """kvmeta's metadata endpoint alone (``python -m services.kvmeta.metadata_http``); its URL."""
    port = free_port()
    group.start(
        "metadata", [sys.executable, "-m", "services.kvmeta.metadata_http", "--port", str(port)]
    )
    url = f"http://127.0.0.1:{port}/metadata"
    wait_metadata(url, group)
    return url


def pct(values: list[float], q: float) -> float:
    """The ``q`` quantile (nearest rank) of ``values``."""
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


async def streamed(
    http: aiohttp.ClientSession, url: str, body: dict[str, Any]
) -> tuple[float, dict[str, Any]]:
    """POST a streamed ``/v1/completions``: (ms from send to the first chunk, last usage)."""
    t0 = time.perf_counter()
    first: float | None = None
    usage: dict[str, Any] = {}
    async with http.post(url + "/v1/completions", json={**body, "stream": True}) as r:
        r.raise_for_status()
        async for raw in r.content:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            if first is None:
                first = time.perf_counter()
            usage = json.loads(line[6:]).get("usage") or usage
    if first is None:
        raise RuntimeError(f"{url}: the stream ended without a chunk")
    return (first - t0) * 1000.0, usage
