"""TTFT with the KV-cache tier on and off, at equal GPU-tier capacity per engine.

One kvmeta process (object master + the Transfer Engine's metadata endpoint; no Postgres or
Redis needed), one ``tideserve engine --role kvcache`` (a DRAM segment of ``--kvcache-mib``),
and two aggregated engines (``--profile``, ``--speedup 1``, ``--kv-blocks`` each). The
requests: the first ``--requests`` of the Mooncake conversation trace's multi-turn chains
(a request whose ``hash_ids`` extend an earlier request's continues that request's chain;
chains of one request are left out: within any 20 consecutive requests of this trace only
~3 % of the blocks repeat, so a short run would measure no reuse at all), in arrival order,
sent one at a time, round robin over the two engines (a router that ignores the cache: consecutive turns of a
session land on the other engine), streamed, ``--max-tokens`` each; TTFT = send → first
streamed token. Two runs on fresh processes: tier off (plain engines) and tier on
(``--kvcache-tier``: write-through of every computed block, fetch of the prefix the tier
holds when the modelled transfer beats prefilling it; ``--kvcache-policy offload_on_evict``
stores only the blocks an engine evicts instead). Run it again with a ``--kv-blocks`` too
small for the working set (but not for the longest prompt) for that case. ``--gateway``:
the requests go through ``tideserve gateway --endpoints`` (its default, cache-aware profile)
instead of round robin, still one at a time.

    .venv/bin/python benchmarks/dataplane_tier.py --requests 20 --out /tmp/t.json
    .venv/bin/python benchmarks/dataplane_tier.py --requests 20 --kv-blocks 1500 --out /tmp/t2.json
    .venv/bin/python benchmarks/dataplane_tier.py --requests 20 --kv-blocks 1500 \
        --kvcache-policy offload_on_evict --out /tmp/t3.json
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._dataplane import pct, streamed, wait_metadata
from benchmarks._harness import (
    MOONCAKE_CONVERSATION,
    ProcGroup,
    command_line,
    emit_json,
    free_port,
    machine,
    tideserve,
    wait_http,
)
from services.common.bench.prompts import PromptSynthesizer
from services.common.bench.traces import TraceRequest, load_trace

DEP = "tierbench"


def wait_port(port: int, group: ProcGroup, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        group.check()
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing listens on {port}")


def start(group: ProcGroup, args: argparse.Namespace, kv_blocks: int, tier: bool) -> list[str]:
    gport, mport = free_port(), free_port()
    env = {
        "TIDESERVE_GRPC_PORT": str(gport),
        "TIDESERVE_METRICS_PORT": "0",
        "TIDESERVE_METADATA_HTTP_PORT": str(mport),
        "TIDESERVE_LOG_FORMAT": "text",
    }
    group.start("kvmeta", [sys.executable, "-m", "services.kvmeta"], env=env)
    meta = f"http://127.0.0.1:{mport}/metadata"
    wait_metadata(meta, group)
    wait_port(gport, group)
    te = ["--te-metadata-url", meta, "--kvmeta-address", f"127.0.0.1:{gport}"]
    common = ["--deployment", DEP, "--log-level", "WARNING", *te]
    if tier:
        kport = free_port()
        group.start(
            "kvcache",
            tideserve("engine", "--role", "kvcache", "--port", str(kport), "--kvcache-mib",
                      str(args.kvcache_mib), *common),
        )  # fmt: skip
        wait_http(f"http://127.0.0.1:{kport}/health", group, timeout_s=120)
    urls = []
    for i in range(2):
        port = free_port()
        extra = (
            ["--kvcache-tier", "--kv-bytes-scale", str(args.kv_bytes_scale),
             "--kvcache-policy", args.kvcache_policy]
            if tier
            else []
        )  # fmt: skip
        group.start(
            f"engine{i}",
            tideserve("engine", "--port", str(port), "--profile", args.profile, "--speedup",
                      "1", "--kv-blocks", str(kv_blocks), *common, *extra),
        )  # fmt: skip
        urls.append(f"http://127.0.0.1:{port}")
    for url in urls:
        wait_http(url + "/health", group, timeout_s=120)
    if args.gateway:  # one target: the gateway routes (its default profile)
        port = free_port()
        group.start(
            "gateway",
            tideserve("gateway", "--host", "127.0.0.1", "--port", str(port), "--endpoints",
                      *urls, "--log-level", "WARNING"),
        )  # fmt: skip
        urls = [f"http://127.0.0.1:{port}"]
        wait_http(urls[0] + "/v1/models", group, timeout_s=120)
    return urls


def multi_turn(requests: Sequence[TraceRequest], n: int) -> list[TraceRequest]:
    """The first ``n`` requests, in arrival order, of chains with two or more turns."""
    first: dict[tuple[int, ...], int] = {}
    root: dict[int, int] = {}
    for r in requests:
        hs = r.hash_ids or ()
        root[r.index] = r.index
        for k in range(len(hs) - 1, 0, -1):
            parent = first.get(hs[:k])
            if parent is not None:
                root[r.index] = root[parent]
                break
        first.setdefault(hs, r.index)
    sizes: dict[int, int] = {}
    for r in requests:
        sizes[root[r.index]] = sizes.get(root[r.index], 0) + 1
    return [r for r in requests if sizes[root[r.index]] >= 2][:n]


async def one_run(args: argparse.Namespace, kv_blocks: int, tier: bool) -> dict[str, Any]:
    reqs = multi_turn(load_trace(args.trace).requests, args.requests)
    prompts = PromptSynthesizer()
    group = ProcGroup(Path(tempfile.mkdtemp(prefix="dataplane_tier_")))
    ttfts: list[float] = []
    cached: list[int] = []
    tokens = 0
    try:
        urls = start(group, args, kv_blocks, tier)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as http:
            for i, r in enumerate(reqs):
                body = {
                    "model": "tideserve-sim",
                    "prompt": prompts.prompt(r),
                    "max_tokens": args.max_tokens,
                    "stream": True,
                    "stream_options": {"include_usage": True},
                }
                t, usage = await streamed(http, urls[i % len(urls)], body)
                ttfts.append(t)
                cached.append(int(usage["prompt_tokens_details"]["cached_tokens"]))
                tokens += r.input_length
    finally:
        group.stop()
    return {
        "tier": tier,
        "policy": args.kvcache_policy if tier else None,
        "kv_blocks_per_engine": kv_blocks,
        "ttft_ms": {
            "mean": round(statistics.mean(ttfts), 1),
            "p50": round(pct(ttfts, 0.5), 1),
            "p90": round(pct(ttfts, 0.9), 1),
        },
        "cached_token_ratio": round(sum(cached) / tokens, 3),
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    runs = [await one_run(args, args.kv_blocks, tier) for tier in (False, True)]
    return {
        "benchmark": "dataplane_tier",
        "command": command_line(),
        "machine": machine(),
        "profile": args.profile,
        "requests": args.requests,
        "requests_from": "multi-turn chains of the trace (see the module doc)",
        "routing": "tideserve gateway (default profile) over 2 engines"
        if args.gateway
        else "round robin over 2 engines, one request at a time",
        "runs": runs,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trace", default=str(MOONCAKE_CONVERSATION))
    p.add_argument("--requests", type=int, default=20)
    p.add_argument("--max-tokens", type=int, default=4)
    p.add_argument("--profile", default="h200-llama3.1-8b")
    p.add_argument("--kv-blocks", type=int, default=8192, help="GPU-tier blocks per engine")
    p.add_argument("--kv-bytes-scale", type=int, default=256)
    p.add_argument("--kvcache-mib", type=int, default=1024)
    p.add_argument(
        "--kvcache-policy",
        choices=["write_through", "offload_on_evict"],
        default="write_through",
        help="what tier-on engines store: every computed block, or only the blocks they evict",
    )
    p.add_argument("--gateway", action="store_true", help="route through tideserve gateway")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    emit_json(asyncio.run(run(args)), args.out)


if __name__ == "__main__":
    main()
