"""Open-loop HTTP load generator of `gateway_overhead.py` (its `_loadgen` subcommand, run in
a process of its own): a fixed inter-arrival load over raw asyncio HTTP/1.1 keep-alive
connections, latency from writing a request to its response being complete."""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import time
from collections.abc import Sequence
from typing import Any

MODEL = "tideserve-sim"


class _Conn(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection, one request at a time."""

    def __init__(self, on_lost: Any) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.fut: asyncio.Future[tuple[int, float, float]] | None = None
        self.sent = 0.0
        self.first = 0.0
        self.on_lost = on_lost
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def send(self, raw: bytes) -> asyncio.Future[tuple[int, float, float]]:
        self.buf.clear()
        self.first = 0.0
        self.fut = asyncio.get_running_loop().create_future()
        self.sent = time.perf_counter()
        assert self.transport is not None
        self.transport.write(raw)
        return self.fut

    def data_received(self, data: bytes) -> None:
        if not self.first:
            self.first = time.perf_counter()
        self.buf += data
        head_end = self.buf.find(b"\r\n\r\n")
        if head_end < 0 or self.fut is None or self.fut.done():
            return
        head = bytes(self.buf[:head_end]).lower()
        body = len(self.buf) - head_end - 4
        m = re.search(rb"\r\ncontent-length: *(\d+)", head)
        if m:
            done = body >= int(m.group(1))
        else:
            done = b"chunked" in head and self.buf.endswith(b"\r\n0\r\n\r\n")
        if done:
            status = int(head[9:12])
            now = time.perf_counter()
            self.fut.set_result((status, self.first - self.sent, now - self.sent))
            if b"\r\nconnection: close" in head:
                self.connection_lost(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.closed:
            return
        self.closed = True
        if self.fut is not None and not self.fut.done():
            self.fut.set_result((0, 0.0, 0.0))
        self.on_lost(self)


def _quantiles(xs: list[float]) -> dict[str, float | None]:
    if not xs:
        return {"mean": None, "p50": None, "p90": None, "p99": None, "max": None}
    s = sorted(xs)

    def q(p: float) -> float:
        return round(s[min(len(s) - 1, int(p * len(s)))] * 1000.0, 3)

    return {"mean": round(sum(s) / len(s) * 1000.0, 3), "p50": q(0.5), "p90": q(0.9),
            "p99": q(0.99), "max": round(s[-1] * 1000.0, 3)}  # fmt: skip


async def _loadgen(host: str, port: int, raw: bytes, rate: float, duration: float,
                   warmup: float, preconnect: int) -> dict[str, Any]:  # fmt: skip
    loop = asyncio.get_running_loop()
    idle: list[_Conn] = []
    live: set[_Conn] = set()

    def lost(c: _Conn) -> None:
        live.discard(c)
        if c in idle:
            idle.remove(c)

    async def connect() -> _Conn:
        _, proto = await loop.create_connection(lambda: _Conn(lost), host, port)
        live.add(proto)
        return proto

    for _ in range(preconnect):
        idle.append(await connect())
    results: list[tuple[int, float, float]] = []
    lags: list[float] = []
    errors = 0
    pending: set[asyncio.Task[None]] = set()

    async def one(measure: bool) -> None:
        nonlocal errors
        try:
            c = idle.pop() if idle else await connect()
            status, ttfb, total = await asyncio.wait_for(c.send(raw), 30.0)
        except (OSError, TimeoutError):
            errors += measure
            return
        if not c.closed:
            idle.append(c)
        if measure:
            if status == 200:
                results.append((status, ttfb, total))
            else:
                errors += 1

    interval = 1.0 / rate
    start = loop.time()
    end_warm = start + warmup
    end = end_warm + duration
    i = 0
    while True:
        due = start + i * interval
        if due >= end:
            break
        now = loop.time()
        if due > now:
            await asyncio.sleep(due - now)
            now = loop.time()
        if due >= end_warm:
            lags.append(now - due)
        t = asyncio.create_task(one(due >= end_warm))
        pending.add(t)
        t.add_done_callback(pending.discard)
        i += 1
    sent = len(lags)
    if pending:
        await asyncio.wait(pending, timeout=35.0)
    for c in list(live):
        if c.transport is not None:
            c.transport.close()
    return {
        "rate_target": rate, "sent": sent, "ok": len(results), "errors": errors,
        "latency_ms": _quantiles([r[2] for r in results]),
        "first_byte_ms": _quantiles([r[1] for r in results]),
        "send_lag_ms": _quantiles(lags), "connections_opened": preconnect + len(live),
    }  # fmt: skip


def request_bytes(
    host: str,
    port: int,
    stream: bool,
    prompt_words: int,
    headers: Sequence[str] = (),
    api: str = "chat",
) -> bytes:
    """One request's bytes; ``headers``: extra ``Name: value`` lines; ``api``: "chat", or the
    same prompt as an Anthropic Messages request (``messages``, ``/v1/messages``) or a
    streamed Responses API one (``responses``, ``/v1/responses``, nothing stored)."""
    words = " ".join(f"w{i % 997}" for i in range(prompt_words))
    if api == "messages":
        path = "/v1/messages"
        body: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": words}],
                                "max_tokens": 8, "stream": stream}  # fmt: skip
    elif stream and api == "responses":
        path = "/v1/responses"
        body = {"model": MODEL, "input": words, "max_output_tokens": 8,
                "stream": True, "store": False}  # fmt: skip
    elif stream:
        path = "/v1/chat/completions"
        body = {"model": MODEL, "messages": [{"role": "user", "content": words}],
                "max_tokens": 8, "stream": True}  # fmt: skip
    else:
        path = "/v1/completions"
        body = {"model": MODEL, "prompt": words, "max_tokens": 8}
    data = json.dumps(body).encode()
    extra = "".join(f"{h}\r\n" for h in headers)
    head = (f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"{extra}Content-Length: {len(data)}\r\n\r\n")  # fmt: skip
    return head.encode() + data


def loadgen_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="gateway_overhead.py _loadgen")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--rate", type=float, required=True)
    p.add_argument("--duration", type=float, required=True)
    p.add_argument("--warmup", type=float, default=2.0)
    p.add_argument("--stream", action="store_true")
    p.add_argument("--prompt-words", type=int, default=128)
    p.add_argument("--header", action="append", default=[], help="'Name: value' (repeatable)")
    p.add_argument("--api", choices=("chat", "messages", "responses"), default="chat")
    a = p.parse_args(argv)
    raw = request_bytes("127.0.0.1", a.port, a.stream, a.prompt_words, a.header, a.api)
    pre = max(8, min(256, int(a.rate * 0.02)))
    out = asyncio.run(_loadgen("127.0.0.1", a.port, raw, a.rate, a.duration, a.warmup, pre))
    out["stream"] = a.stream
    print(json.dumps(out))
    return 0
