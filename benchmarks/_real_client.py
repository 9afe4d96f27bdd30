"""The client of ``real_engines.py``: streamed chat requests paced per session, and their
summary (TTFT mean/p50/p90, hit ratio from the engines' usage)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp

from services.bench.sse import StreamError, StreamState

__all__ = ["run_requests", "summarize"]


async def _one(http: aiohttp.ClientSession, url: str, req: dict[str, Any]) -> dict[str, Any]:
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": req["prompt"]}],
        "max_tokens": req["max_tokens"],
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    sent = time.monotonic()
    state = StreamState(sent)
    error = None
    try:
        async with http.post(url + "/v1/chat/completions", json=body) as resp:
            if resp.status != 200:
                error = f"HTTP {resp.status}: {(await resp.text())[:200]}"
            else:
                async for raw in resp.content:
                    state.feed_line(raw.decode(errors="replace"), time.monotonic())
    except (aiohttp.ClientError, TimeoutError, StreamError) as err:
        error = str(err) or type(err).__name__
    o = state.finish(time.monotonic(), error)
    return {
        "session": req["session"], "turn": req["turn"], "error": o.error,
        "ttft_ms": None if o.ttft_s is None else o.ttft_s * 1000.0,
        "e2e_ms": o.e2e_s * 1000.0, "prompt_tokens": o.prompt_tokens,
        "cached_tokens": o.cached_tokens, "sent_s": sent,
    }  # fmt: skip


async def run_requests(
    url: str, reqs: list[dict[str, Any]], rate: float, timeout_s: float
) -> list[dict[str, Any]]:
    """Request i is due at ``i / rate``; a turn also waits for its session's previous turn."""
    start = time.monotonic()
    last: dict[int, asyncio.Task[dict[str, Any]]] = {}
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(timeout=timeout) as http:

        async def send(i: int, req: dict[str, Any], prev: asyncio.Task[Any] | None) -> Any:
            await asyncio.sleep(max(0.0, start + i / rate - time.monotonic()))
            if prev is not None:
                await asyncio.wait([prev])
            out = await _one(http, url, req)
            out["sent_s"] -= start
            return out

        tasks = []
        for i, req in enumerate(reqs):
            task = asyncio.create_task(send(i, req, last.get(req["session"])))
            last[req["session"]] = task
            tasks.append(task)
        return list(await asyncio.gather(*tasks))


def _pct(xs: list[float], q: float) -> float:
    """Nearest-rank percentile of a non-empty list."""
    s = sorted(xs)
    k = max(0, min(len(s) - 1, round(q / 100.0 * len(s) + 0.5) - 1))
    return s[k]


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    """TTFT (ms) mean/p50/p90/max, hit ratio = cached / prompt tokens over OK requests."""
    ok = [r for r in results if r["error"] is None and r["ttft_ms"] is not None]
    errors: dict[str, int] = {}
    for r in results:
        if r["error"] is not None:
            errors[r["error"][:120]] = errors.get(r["error"][:120], 0) + 1
    out: dict[str, Any] = {"completed": len(ok), "failed": len(results) - len(ok)}
    if errors:
        out["errors"] = errors
    if not ok:
        return out
    ttft = [r["ttft_ms"] for r in ok]
    prompt = sum(r["prompt_tokens"] or 0 for r in ok)
    cached = sum(r["cached_tokens"] or 0 for r in ok)
    out["ttft_ms"] = {
        "mean": round(sum(ttft) / len(ttft), 1), "p50": round(_pct(ttft, 50), 1),
        "p90": round(_pct(ttft, 90), 1), "max": round(max(ttft), 1),
    }  # fmt: skip
    out["prompt_tokens"] = prompt
    out["cached_tokens"] = cached
    out["hit_ratio"] = round(cached / prompt, 4) if prompt else 0.0
    return out
