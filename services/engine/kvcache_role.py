"""``tideserve engine --role kvcache``: one DRAM segment of the KV-cache tier (shell).

No model and no generation API: the process starts a Transfer Engine on kvmeta's metadata
endpoint (``--te-metadata-url``), registers an arena of ``--kvcache-mib`` MiB and mounts it
in kvmeta's object master (``MountSegment`` over gRPC to ``--kvmeta-address``, deployment
``--deployment``, tier CPU). Engines then store and fetch blocks in it directly over the
Transfer Engine (:class:`services.dataplane.tier.KVTier`); kvmeta places, leases and evicts
them (its watermark). ``GET /health`` answers ``{"role": "kvcache", "segment", "capacity_bytes"}``
once mounted. On SIGTERM the segment is unmounted (its objects vanish from kvmeta) and the
Transfer Engine deletes its keys.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import grpc
from aiohttp import web
from tideserve.v1 import kvmeta_pb2_grpc

from services.dataplane.tier import KVTier
from services.dataplane.transfer import Arena
from services.engine.kvbytes import data_plane_for
from services.engine.settings import EngineSettings
from services.engine.tier_io import kvmeta_channel

__all__ = ["serve_kvcache"]

log = logging.getLogger(__name__)


async def serve_kvcache(settings: EngineSettings, stop: asyncio.Event) -> int:
    """Hold the segment until ``stop`` is set. Raises DataPlaneError / AioRpcError at start."""
    plane = data_plane_for(settings)
    arena = Arena(settings.kvcache_mib << 20)
    channel = kvmeta_channel(settings)
    tier = KVTier(kvmeta_pb2_grpc.KVMetaServiceStub(channel), plane, settings.deployment)
    mounted = False
    runner: web.AppRunner | None = None
    try:
        await plane.start()
        await plane.register(arena)
        instance = settings.instance_id or plane.segment
        await tier.mount(arena, instance)
        mounted = True

        async def health(_req: web.Request) -> web.Response:
            return web.json_response(
                {"role": "kvcache", "segment": plane.segment, "capacity_bytes": arena.size}
            )

        app = web.Application()
        app.router.add_get("/health", health)
        runner = web.AppRunner(app, handle_signals=False)
        await runner.setup()
        await web.TCPSite(runner, settings.host, settings.port).start()
        log.info("kvcache segment %s (%d MiB) mounted", plane.segment, settings.kvcache_mib)
        await stop.wait()
        return 0
    finally:
        if runner is not None:
            await runner.cleanup()
        if mounted:
            with contextlib.suppress(grpc.aio.AioRpcError):
                await tier.unmount()
        await channel.close()
        await plane.close()
        arena.close()
