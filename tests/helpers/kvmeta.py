"""kvmeta assembled in process for tests: the index feeder on a real Redis and the gRPC
servicer on a free loopback port."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import grpc
import redis.asyncio as aioredis
from tideserve.v1 import kvmeta_pb2_grpc

from services.kvmeta.index import PrefixIndex
from services.kvmeta.ingest import IndexFeeder
from services.kvmeta.objects import ObjectMaster
from services.kvmeta.servicer import KVMetaServicer, ObjectShell, add_to_server
from services.kvmeta.sessions import SessionShell
from tests.helpers.waits import bounded

__all__ = ["serve_kvmeta", "serve_sessions"]


@asynccontextmanager
async def serve_kvmeta(
    redis: aioredis.Redis, prefix: str
) -> AsyncIterator[tuple[str, IndexFeeder]]:
    """``(address, feeder)`` of a kvmeta indexing the streams under ``prefix``."""
    feeder = IndexFeeder(
        PrefixIndex(),
        time.time,
        redis=redis,
        prefix=prefix,
        checkpoint_interval_s=0,
        discover_interval_s=0.1,
        block_ms=50,
    )
    await feeder.start()
    server = grpc.aio.server()
    add_to_server(KVMetaServicer(feeder, ObjectShell(ObjectMaster(), None, time.time)), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}", feeder
    finally:
        await bounded(server.stop(None), "stopping the kvmeta gRPC server")
        await bounded(feeder.stop(checkpoint=False), "stopping the kvmeta feeder")


@asynccontextmanager
async def serve_sessions(
    shell: SessionShell,
) -> AsyncIterator[tuple[str, kvmeta_pb2_grpc.KVMetaServiceStub]]:
    """``(address, stub)`` of a kvmeta holding sessions in ``shell`` (an empty index, no
    Redis) on a free loopback port, on ``shell``'s clock."""
    servicer = KVMetaServicer(
        IndexFeeder(PrefixIndex(), time.time),
        ObjectShell(ObjectMaster(), None, shell.now),
        sessions=shell,
    )
    server = grpc.aio.server()
    add_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield f"127.0.0.1:{port}", kvmeta_pb2_grpc.KVMetaServiceStub(channel)
    finally:
        await channel.close()
        await bounded(server.stop(None), "stopping the kvmeta gRPC server")
