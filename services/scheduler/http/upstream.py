"""Talking to engines: probes, load scraping and request forwarding (aiohttp I/O only)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from yarl import URL

from services.common import jsonfast
from services.common.routing.types import EndpointView


async def probe(session: aiohttp.ClientSession, url: str, timeout_s: float) -> bool:
    try:
        async with session.get(
            url + "/health", timeout=aiohttp.ClientTimeout(total=timeout_s)
        ) as r:
            await r.read()
            return r.status == 200
    except (aiohttp.ClientError, TimeoutError, OSError):
        return False


async def list_models(session: aiohttp.ClientSession, url: str, timeout_s: float) -> list[str]:
    try:
        async with session.get(
            url + "/v1/models", timeout=aiohttp.ClientTimeout(total=timeout_s)
        ) as r:
            body = await r.json(content_type=None)
            return [str(m["id"]) for m in body.get("data", []) if isinstance(m, dict)]
    except (aiohttp.ClientError, TimeoutError, OSError, ValueError, KeyError, AttributeError):
        return []


def bootstrap_fields(prefill: EndpointView, room: int) -> dict[str, Any]:
    """SGLang bootstrap values for a prefill instance (its HTTP port when it has no
    dedicated bootstrap port: the simulator serves ``/bootstrap/{room}`` there too)."""
    parts = urlsplit(prefill.url)
    host = prefill.bootstrap_host or parts.hostname or "127.0.0.1"
    port = prefill.bootstrap_port or parts.port or 80
    return {"bootstrap_host": host, "bootstrap_port": port, "bootstrap_room": room}


@dataclass(slots=True)
class UpstreamFailure(Exception):
    """The upstream failed before any byte reached the client (safe to retry)."""

    instance_id: str
    reason: str
    status: int = 502


@lru_cache(maxsize=4096)
def _url(base: str, path: str) -> URL:
    """The parsed URL of ``base + path`` (parsed once per endpoint and path)."""
    return URL(base + path)


async def open_upstream(
    session: aiohttp.ClientSession,
    endpoint: EndpointView,
    path: str,
    body: Mapping[str, Any] | bytes,
    headers: Mapping[str, str],
    client_timeout: aiohttp.ClientTimeout,
) -> aiohttp.ClientResponse:
    """POST ``body`` (JSON-encoded; bytes are sent as they are) and return the response
    once headers arrived; 5xx and connection errors raise :class:`UpstreamFailure` (the
    response is released). 4xx responses are returned."""
    try:
        resp = await session.post(
            _url(endpoint.url, path),
            data=body if isinstance(body, bytes) else jsonfast.dumps(body),
            headers=headers,
            timeout=client_timeout,
        )
    except (aiohttp.ClientError, TimeoutError, OSError) as e:
        raise UpstreamFailure(endpoint.instance_id, f"connect: {e!r}") from None
    if resp.status >= 500:
        try:
            text = (await resp.text(errors="replace"))[:300]
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            text = f"(body unread: {e!r})"  # the engine went away mid-answer: still a 5xx
        finally:
            resp.release()
        raise UpstreamFailure(endpoint.instance_id, f"HTTP {resp.status}: {text}", resp.status)
    return resp


async def drain_prefill(
    session: aiohttp.ClientSession,
    endpoint: EndpointView,
    path: str,
    body: Mapping[str, Any],
    headers: Mapping[str, str],
    client_timeout: aiohttp.ClientTimeout,
) -> None:
    """Send the prefill half of a disaggregated request and read its answer to the end.
    Raises :class:`UpstreamFailure` on a connection error or a 5xx."""
    resp = await open_upstream(session, endpoint, path, body, headers, client_timeout)
    try:
        await resp.read()
    except (aiohttp.ClientError, TimeoutError, OSError) as e:
        raise UpstreamFailure(endpoint.instance_id, f"prefill read: {e!r}") from None
    finally:
        resp.release()


async def cancel_quietly(task: asyncio.Task[Any] | None) -> None:
    """Cancel ``task`` and wait for it, ignoring how it ended; the caller's own
    cancellation (arriving while it waits) still propagates."""
    if task is None or task.done():
        return
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise
    except Exception:
        return
