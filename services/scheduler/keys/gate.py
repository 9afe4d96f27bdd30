"""The gateway's key check: an aiohttp middleware (who is calling) and a post-parse hook
(what the request may do, and whether its tenant is within its rate limits).

- :meth:`KeyGate.middleware`: on the OpenAI routes (``/v1/*``, ``/generate``), the
  ``Authorization: Bearer sk-ts-...`` key (or Anthropic's ``x-api-key``) is looked up through the :class:`KeyCache`
  (hashed; Postgres at most once per key per ``ttl_s``): none, unknown or revoked → 401
  (``WWW-Authenticate: Bearer``); the store down with nothing recent cached → 503.
- :meth:`KeyGate.admit` (after parsing, before admission): tenant, class and cache salt
  from the key (:func:`~.model.resolve`; 403 when the request claims another tenant or a
  class the key does not permit), then the tenant's window (:mod:`.ratelimit`, counters
  in Redis): 429 with ``Retry-After`` over a limit, 400 when one request's tokens exceed
  the key's ``tpm``. The request's forwarded ``cache_salt`` becomes the tenant's salt, so
  the engine's prefix cache is namespaced the same way as the gateway's block hashes.
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter

from services.scheduler.http.openai import ApiError, ParsedRequest, error_body
from services.scheduler.keys.cache import KeyCache, KeysUnavailable
from services.scheduler.keys.counters import Counters
from services.scheduler.keys.model import (
    ApiKey,
    Denied,
    bearer_token,
    hash_key,
    looks_like_key,
    resolve,
)
from services.scheduler.keys.ratelimit import (
    Allow,
    Lease,
    Limited,
    TooLarge,
    decide,
    lease_size,
    spend,
    window_index,
)

__all__ = ["KEY_KEY", "KeyGate", "RateLimited"]

KEY_KEY = web.RequestKey("tideserve.api_key", ApiKey)
"""Where the middleware leaves the caller's :class:`ApiKey` on the request."""

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class RateLimited(ApiError):
    """429: the tenant is over its requests or tokens per window."""

    def __init__(self, message: str, retry_after_ms: int) -> None:
        super().__init__(429, message, None, "rate_limit_exceeded", "rate_limit_error")
        self.retry_after_ms = retry_after_ms


def _guarded(path: str) -> bool:
    return path.startswith("/v1/") or path == "/generate"


def _refusal(status: int, message: str, code: str, etype: str) -> web.Response:
    resp = web.json_response(error_body(message, etype, None, code), status=status)
    if status == 401:
        resp.headers["WWW-Authenticate"] = "Bearer"
    return resp


class KeyGate:
    """``classes``: every SLO class, highest first; ``window_s``: the rate-limit window
    (limits are per window: 60 s makes them per minute); ``lease_fraction``: the share of
    a limit this replica reserves at once (0: one round trip per request); ``wall``: the
    wall clock the windows are cut on (shared by replicas)."""

    def __init__(
        self,
        cache: KeyCache,
        counters: Counters,
        *,
        classes: Sequence[str],
        default_class: str,
        window_s: float = 60.0,
        lease_fraction: float = 0.0,
        wall: Callable[[], float] = time.time,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.cache = cache
        self.counters = counters
        self.classes = tuple(classes)
        self.default_class = default_class
        self.window_ms = max(1, int(window_s * 1000))
        self.wall = wall
        self.lease_fraction = lease_fraction
        self._leases: dict[str, Lease] = {}  # per tenant
        # what close() releases (the store's pool, the Redis client)
        self.closers: list[Callable[[], Awaitable[None]]] = []
        self.refused = Counter(
            "tideserve_gateway_auth_refused_total",
            "Requests the API-key check refused, by reason",
            ["reason"],
            registry=registry,
        )

    async def close(self) -> None:
        for close in self.closers:
            await close()
        self.closers.clear()

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if not _guarded(request.path):
            return await handler(request)
        # Anthropic clients send an API key as x-api-key (Claude Code: ANTHROPIC_API_KEY).
        token = bearer_token(request.headers.get("Authorization")) or request.headers.get(
            "x-api-key", ""
        )
        if not token:
            self.refused.labels("missing_key").inc()
            return _refusal(
                401,
                "no API key: send 'Authorization: Bearer sk-ts-...'",
                "missing_api_key",
                "authentication_error",
            )
        try:
            key = await self.cache.get(hash_key(token)) if looks_like_key(token) else None
        except KeysUnavailable:
            self.refused.labels("store_unavailable").inc()
            return _refusal(
                503, "API keys cannot be checked right now", "keys_unavailable", "server_error"
            )
        if key is None or not key.live:
            self.refused.labels("invalid_key").inc()
            return _refusal(
                401, "invalid or revoked API key", "invalid_api_key", "authentication_error"
            )
        request[KEY_KEY] = key
        return await handler(request)

    async def admit(self, request: web.Request, parsed: ParsedRequest) -> ParsedRequest:
        """``parsed`` under the caller's key (tenant, class, salt), counted against its
        tenant's limits. Raises :class:`ApiError` (403, 400) or :class:`RateLimited`."""
        key = request[KEY_KEY]
        g = resolve(
            key,
            tenant=parsed.tenant,
            slo_class=parsed.slo_class,
            cache_salt=parsed.cache_salt,
            default_class=self.default_class,
            classes=self.classes,
        )
        if isinstance(g, Denied):
            self.refused.labels(f"forbidden_{g.param}").inc()
            raise ApiError(403, g.message, g.param, "forbidden", "permission_error")
        if key.rpm is not None or key.tpm is not None:
            await self._count(key, len(parsed.prompt_ids) + parsed.max_tokens)
        body: dict[str, Any] = {**parsed.forward_body, "cache_salt": g.cache_salt}
        native = parsed.native_body
        return replace(
            parsed,
            native_body=None if native is None else {**native, "cache_salt": g.cache_salt},
            tenant=g.tenant,
            slo_class=g.slo_class,
            cache_salt=g.cache_salt,
            forward_body=body,
            raw_body=b"",  # the body changed: never forward the client's bytes (its salt)
        )

    async def _leased(self, key: ApiKey, index: int, elapsed: float, cost: int) -> bool:
        """Admitted from this replica's lease of the tenant's budget (topped up with one
        round trip when it runs out, :mod:`.ratelimit`); False: decide the request alone."""
        tenant, w = key.tenant, self.window_ms
        lease = self._leases.get(tenant)
        if lease is not None and lease.index == index:
            left = spend(lease, key.rpm, key.tpm, cost)
            if left is not None:
                self._leases[tenant] = left
                return True
            # short in one dimension: kept, and merged into the next lease below
        elif lease is not None:
            del self._leases[tenant]
            if lease.requests or lease.tokens:
                # unspent budget of a past window goes back to it (its weight in the
                # sliding window still counts)
                await self.counters.add(tenant, lease.index, -lease.requests, -lease.tokens, w)
        if self.lease_fraction <= 0:
            return False
        r, t = lease_size(key.rpm, key.tpm, cost, self.lease_fraction)
        if r <= 1:
            return False  # no bigger than the request itself
        counts = await self.counters.add(tenant, index, r, t, w)
        d = decide(
            counts, elapsed=elapsed, window_ms=w, rpm=key.rpm, tpm=key.tpm, cost=t, requests=r
        )
        if not isinstance(d, Allow):
            await self.counters.add(tenant, index, -r, -t, w)
            return False
        got = Lease(index, r - 1, t - cost)
        cur = self._leases.get(tenant)  # a lease another request took meanwhile
        if cur is not None and cur.index == index:
            got = Lease(index, cur.requests + got.requests, cur.tokens + got.tokens)
        self._leases[tenant] = got
        return True

    async def _count(self, key: ApiKey, cost: int) -> None:
        index, elapsed = window_index(int(self.wall() * 1000), self.window_ms)
        if await self._leased(key, index, elapsed, cost):
            return
        w = self.window_ms
        counts = await self.counters.add(key.tenant, index, 1, cost, w)
        d = decide(counts, elapsed=elapsed, window_ms=w, rpm=key.rpm, tpm=key.tpm, cost=cost)
        if isinstance(d, Limited | TooLarge):
            await self.counters.add(key.tenant, index, -1, -cost, w)  # not served: not counted
        if isinstance(d, TooLarge):
            self.refused.labels("too_many_tokens").inc()
            raise ApiError(
                400,
                f"this request needs {d.cost} tokens (prompt + max_tokens), over the key's "
                f"limit of {d.limit} per window",
                "max_tokens",
                "tokens_over_limit",
            )
        if isinstance(d, Limited):
            self.refused.labels(f"rate_{d.what}").inc()
            per = f"{w / 1000:g} s"
            raise RateLimited(
                f"tenant {key.tenant!r} is over its limit of {d.limit} {d.what} per {per}; "
                f"retry in {math.ceil(d.retry_after_ms / 1000)} s",
                d.retry_after_ms,
            )
