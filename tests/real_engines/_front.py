"""Tideserve in front of real vLLM servers, built from the product's parts in this process:
a kv-bridge per engine (ZMQ → the Redis stream ``{prefix}:kv:{deployment}``), kvmeta's index
feeder and gRPC servicer on that stream, and the gateway (the scheduler's composition root,
``services.scheduler.compose.Scheduler``) with the model's tokenizer and vLLM's block hashes.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import aiohttp
import redis.asyncio as aioredis
from tideserve.v1 import events_pb2

from services.common.streams import decode_entry
from services.kvbridge.run import KVBridge
from services.kvbridge.settings import KVBridgeSettings
from services.kvmeta.ingest import IndexFeeder
from services.scheduler.compose import Scheduler
from services.scheduler.http.openai import parse_request
from services.scheduler.keys.gate import KeyGate
from services.scheduler.settings import SchedulerSettings
from tests.helpers.kvmeta import serve_kvmeta
from tests.helpers.ports import free_port
from tests.helpers.vllm import BLOCK_SIZE, VLLMServer
from tests.helpers.waits import bounded, eventually

__all__ = ["Front", "front", "instance_id", "running_bridge"]

DEPLOYMENT = "tiny"


def instance_id(server: VLLMServer) -> str:
    """The gateway's id of a static endpoint (``host:port``); the bridge stamps the same."""
    return f"127.0.0.1:{server.port}"


@dataclass
class Front:
    url: str
    prefix: str
    redis: aioredis.Redis
    feeder: IndexFeeder
    scheduler: Scheduler
    bridges: dict[str, KVBridge] = field(default_factory=dict)
    replica_urls: tuple[str, ...] = ()
    """Every gateway replica's URL (``url`` first): replicas share Redis, kvmeta and
    Postgres, and nothing else."""

    @property
    def kv_stream(self) -> str:
        return f"{self.prefix}:kv:{DEPLOYMENT}"

    async def kv_batches(self) -> list[events_pb2.KVEventBatch]:
        got = await self.redis.xrange(self.kv_stream)
        return [decode_entry(f, events_pb2.KVEventBatch) for _, f in got]

    async def records(self, n: int) -> list[events_pb2.RequestRecord]:
        """The gateway's request records once there are ``n``."""
        stream = f"{self.prefix}:requests"
        out: list[events_pb2.RequestRecord] = []

        async def enough() -> bool:
            nonlocal out
            got = await self.redis.xrange(stream)
            out = [decode_entry(f, events_pb2.RequestRecord) for _, f in got]
            return len(out) >= n

        await eventually(enough, within_s=30)
        return out

    def held(self, server: VLLMServer, hashes: list[int], tenant: str = "") -> int:
        """How many leading blocks of ``hashes`` kvmeta's index holds on ``server``."""
        iid = instance_id(server)
        if DEPLOYMENT not in self.feeder.block_sizes:
            return 0  # no event of the deployment yet
        got = self.feeder.index.match_prefix(DEPLOYMENT, tenant, hashes, [iid])
        return max((m.matched_blocks for m in got if m.instance_id == iid), default=0)

    def hashes(self, body: dict[str, Any], cache_salt: str = "") -> list[int]:
        """The block hashes the gateway computes for a chat ``body`` (salted as a keyed
        request's namespace ``cache_salt`` would be)."""
        gw = self.scheduler.gateway
        parsed = parse_request(
            "chat", json.dumps(body).encode(), {}, models=(), classes=[], tokens=gw.opts.tokens
        )
        return gw.opts.tokens.block_hashes(parsed.prompt_ids, BLOCK_SIZE, tenant=cache_salt)


@contextlib.asynccontextmanager
async def running_bridge(
    redis: aioredis.Redis, redis_url: str, prefix: str, server: VLLMServer
) -> AsyncIterator[KVBridge]:
    settings = KVBridgeSettings(
        endpoint=server.events_endpoint,
        replay_endpoint=server.replay_endpoint,
        topic="kv",
        redis_url=redis_url,
        stream_prefix=prefix,
        deployment=DEPLOYMENT,
        instance_id=instance_id(server),
    )
    bridge = KVBridge(settings, redis)
    stop, ready = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(bridge.run(stop, ready))
    try:
        await asyncio.wait_for(ready.wait(), 30)
        yield bridge
    finally:
        stop.set()
        await bounded(task, "stopping a kv-bridge")


@contextlib.asynccontextmanager
async def front(
    servers: list[VLLMServer],
    redis_url: str,
    model_dir: Path,
    *,
    precise_source: Literal["kvmeta", "local"] = "kvmeta",
    keys: KeyGate | None = None,
    endpoint_roles: tuple[str, ...] = (),
    replicas: int = 1,
    **settings: Any,
) -> AsyncIterator[Front]:
    """``endpoint_roles``: each server's role (prefill, decode; default: workers);
    ``replicas``: gateway replicas (``Front.scheduler`` is the first)."""
    roles = endpoint_roles or ("worker",) * len(servers)
    # These tests check that real engines' KV events drive routing, not kvmeta's latency:
    # past its 20 ms default a loaded machine's lookup is dropped and the pick goes by load.
    settings.setdefault("kvmeta_deadline_ms", 5000.0)
    prefix = f"rt{uuid.uuid4().hex[:8]}"
    redis = aioredis.Redis.from_url(redis_url)
    try:
        async with contextlib.AsyncExitStack() as stack:
            feeder_addr, feeder = await stack.enter_async_context(serve_kvmeta(redis, prefix))
            bridges = {}
            for s in servers:
                bridges[instance_id(s)] = await stack.enter_async_context(
                    running_bridge(redis, redis_url, prefix, s)
                )
            ports = [free_port() for _ in range(replicas)]
            schedulers = [
                Scheduler(
                    SchedulerSettings(
                        http_port=port,
                        grpc_port=0,
                        endpoints=[f"{r}={s.url}" for r, s in zip(roles, servers, strict=True)],
                        deployment=DEPLOYMENT,
                        model_path=model_dir,
                        hash_scheme="vllm",
                        block_size=BLOCK_SIZE,
                        redis_url=redis_url,
                        stream_prefix=prefix,
                        kvmeta_address=feeder_addr,
                        precise_source=precise_source,
                        **settings,
                    )
                )
                for port in ports
            ]
            for port, scheduler in zip(ports, schedulers, strict=True):
                if keys is not None:
                    scheduler.gateway.keys = keys
                await scheduler.start(("127.0.0.1", port, False))
                stack.push_async_callback(scheduler.stop)
            urls = tuple(f"http://127.0.0.1:{port}" for port in ports)
            for k, scheduler in enumerate(schedulers):
                f = Front(urls[k], prefix, redis, feeder, scheduler, bridges, urls)
                await eventually(functools.partial(_serving, f, len(servers)), within_s=30)
            yield Front(urls[0], prefix, redis, feeder, schedulers[0], bridges, urls)
    finally:
        await redis.aclose()


async def _serving(f: Front, n: int) -> bool:
    """Every engine is eligible and the gateway answers its health check."""
    now = f.scheduler.gateway.clock()
    views = list(f.scheduler.core.fleet.snapshot(now))
    if len([v for v in views if v.eligible]) < n:
        return False
    async with aiohttp.ClientSession() as http, http.get(f.url + "/health") as r:
        return r.status == 200
