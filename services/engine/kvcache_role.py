"""``tideserve engine --role kvcache``: the KV-cache tier's DRAM segment, and optionally a
disk segment beside it (shell).

No model and no generation API: the process starts a Transfer Engine on kvmeta's metadata
endpoint (``--te-metadata-url``), registers an arena of ``--kvcache-mib`` MiB and mounts it
in kvmeta's object master (``MountSegment`` over gRPC to ``--kvmeta-address``, deployment
``--deployment``, tier CPU). Engines then store and fetch blocks in it directly over the
Transfer Engine (:class:`services.common.dataplane.tier.KVTier`); kvmeta places, leases and evicts
them (its watermark). Restarted under the same segment name after a kill -9, it takes over
the Transfer Engine keys its dead predecessor left in the metadata server
(:mod:`services.common.dataplane.metadata`) and replaces that one's mount in kvmeta (its objects
pointed into memory that is gone).

With ``--kvcache-disk-mib`` the process also holds a disk segment (tier SSD, files in
``--kvcache-disk-dir``; :mod:`services.engine.kvcache_disk`): blocks are put into it through
``POST /kvcache/disk/put`` (``{"tenant", "keys", "size", "source", "addrs"}``: the process
pulls them from Transfer Engine segment ``source``, logs them durably, commits them in kvmeta,
then answers ``{"offsets"}``), and after a restart what it held is served again.

``GET /health`` answers ``{"role": "kvcache", "segment", "capacity_bytes", "disk"}`` once
everything is mounted (``disk``: null, or the disk segment's name, size, blocks held and what
the start restored). On SIGTERM both segments are unmounted (their objects vanish from
kvmeta; the disk keeps its blocks for the next start) and the Transfer Engine deletes its
keys.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import aiohttp
import grpc
from aiohttp import web
from tideserve.v1 import kvmeta_pb2_grpc

from services.common.dataplane.metadata import take_over_dead_segment
from services.common.dataplane.tier import KVTier
from services.common.dataplane.transfer import Arena, TransferError
from services.engine.kvbytes import data_plane_for
from services.engine.kvcache_disk import DiskSegment, PutRefused
from services.engine.settings import EngineSettings
from services.engine.tier_io import kvmeta_channel

__all__ = ["serve_kvcache"]

log = logging.getLogger(__name__)


def _disk_for(settings: EngineSettings, tier: KVTier) -> DiskSegment | None:
    if not settings.kvcache_disk_mib:
        return None
    if not settings.port and not settings.te_hostname:
        raise ValueError(
            "a disk segment needs a segment name that survives a restart: give --port or "
            "--te-hostname"
        )
    root = settings.kvcache_disk_dir or settings.state_dir / "kvcache-disk"
    return DiskSegment(
        root, settings.kvcache_disk_mib << 20, tier, settings.kvcache_disk_compact_records
    )


def _app(tier: KVTier, arena: Arena, disk: DiskSegment | None) -> web.Application:
    async def health(_req: web.Request) -> web.Response:
        return web.json_response(
            {
                "role": "kvcache",
                "segment": tier.plane.segment,
                "capacity_bytes": arena.size,
                "disk": disk.health() if disk is not None else None,
            }
        )

    async def disk_put(req: web.Request) -> web.Response:
        if disk is None:
            return _error(404, "this kvcache instance has no disk segment (--kvcache-disk-mib)")
        try:
            body: Any = await req.json()
            args = (
                str(body.get("tenant", "")),
                [str(k) for k in body["keys"]],
                int(body["size"]),
                str(body["source"]),
                [int(a) for a in body["addrs"]],
            )
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            return _error(400, f"bad put: {err!r}")
        try:
            offsets = await disk.put(*args)
        except PutRefused as err:
            return _error(400 if "need" in str(err) else 507, str(err))
        except grpc.aio.AioRpcError as err:
            status = _HTTP_STATUS.get(err.code(), 503)
            return _error(status, f"kvmeta: {err.code().name}: {err.details()}")
        except TransferError as err:
            return _error(503, f"transfer: {err}")
        return web.json_response({"offsets": offsets})

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_post("/kvcache/disk/put", disk_put)
    return app


# kvmeta's answer to a put → the HTTP status of ``/kvcache/disk/put`` (else 503: retry later).
_HTTP_STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.ALREADY_EXISTS: 409,  # a key is already stored (or being stored)
    grpc.StatusCode.RESOURCE_EXHAUSTED: 507,
}


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message}}, status=status)


async def serve_kvcache(settings: EngineSettings, stop: asyncio.Event) -> int:
    """Hold the segments until ``stop`` is set. Raises DataPlaneError / AioRpcError at start."""
    plane = data_plane_for(settings)
    arena = Arena(settings.kvcache_mib << 20)
    channel = kvmeta_channel(settings)
    tier = KVTier(kvmeta_pb2_grpc.KVMetaServiceStub(channel), plane, settings.deployment)
    disk = _disk_for(settings, tier)
    mounted = False
    runner: web.AppRunner | None = None
    try:
        # Restarted under its own name, an instance killed with SIGKILL left its Transfer
        # Engine keys behind: take them over when their owner is dead.
        # (Unreachable metadata server: the Transfer Engine's start below says so.)
        with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
                if await take_over_dead_segment(http, settings.te_metadata_url, plane.segment):
                    log.info("took over segment %s from a process that died", plane.segment)
        await plane.start()
        await plane.register(arena)
        instance = settings.instance_id or plane.segment
        await tier.mount(arena, instance, replace=True)
        mounted = True
        if disk is not None:
            await disk.start(instance)
        runner = web.AppRunner(_app(tier, arena, disk), handle_signals=False)
        await runner.setup()
        await web.TCPSite(runner, settings.host, settings.port).start()
        log.info("kvcache segment %s (%d MiB) mounted", plane.segment, settings.kvcache_mib)
        await stop.wait()
        return 0
    finally:
        if runner is not None:
            await runner.cleanup()
        if disk is not None:
            await disk.close(unmount=True)
        if mounted:
            with contextlib.suppress(grpc.aio.AioRpcError):
                await tier.unmount()
        await channel.close()
        await plane.close()
        arena.close()
