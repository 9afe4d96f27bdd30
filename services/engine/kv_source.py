"""Where a generation request's KV comes from, before the core sees it (the engine shell's
intake): pulled from a P/D peer (vLLM's two-step flow, with real KV bytes when the engine has
them), held for an SGLang bootstrap rendezvous, or fetched from the KV-cache tier."""

from __future__ import annotations

import dataclasses

import aiohttp
from aiohttp import web

from services.common.engine_core.core import EngineRole, Request
from services.engine import api, pd_sglang, pd_vllm
from services.engine.pd_bytes import PDBytes
from services.engine.tier_io import TierIO

__all__ = ["core_request"]


async def core_request(
    rid: str,
    gen: api.GenRequest,
    role: EngineRole,
    http: aiohttp.ClientSession | None,
    remote_kv: pd_vllm.RemoteKV,
    rendezvous: pd_sglang.Rendezvous,
    pd_bytes: PDBytes | None,
    tier_io: TierIO | None,
) -> Request | web.Response:
    """The core's request for ``gen`` (or the HTTP answer that ends it early)."""
    remote = remote_kv.core_request(rid, gen)
    if remote is not None:
        loc = gen.kv_transfer.tideserve_kv if gen.kv_transfer else None
        if remote.remote_prefill and loc is not None and pd_bytes is not None:
            spent = await pd_bytes.pull(rid, gen, loc)
            if spent is None:  # the pull failed: the peer may free; recompute here
                remote_kv.finish(http, rid)
                return Request(rid, gen.prompt_ids, gen.max_new_tokens, gen.tenant)
            return dataclasses.replace(remote, pulled_ms=spent)
        return remote
    b = gen.bootstrap
    base = Request(rid, gen.prompt_ids, gen.max_new_tokens, gen.tenant)
    if b is None:
        return base if tier_io is None else await tier_io.fetch(base, gen)
    if role is EngineRole.PREFILL:
        held = rendezvous.prefill_request(rid, gen)
        return held if tier_io is None else await tier_io.fetch(held, gen)
    if role is EngineRole.DECODE and b.port is not None:
        assert http is not None
        return await rendezvous.decode_request(http, rid, gen)
    return base
