"""Steady load for the chaos suite: the bench's streaming client loop, with retries.

Each request is a streamed ``/v1/completions`` call parsed by the bench's
:class:`~services.bench.sse.StreamState`. Its outcome (pure :func:`classify`):

- ``ok``: the stream ended with ``[DONE]``;
- ``retry``: nothing was streamed yet and the failure is one a client retries: the gateway
  refused or dropped the connection, or answered 429/502/503/504 with an OpenAI-style error
  body (the request was not accepted, or it was accepted and then given back unstarted);
- ``final``: a well-formed error answer a client must not retry (any other status with an
  OpenAI-style body, or a stream that reported an error after it started);
- ``interrupted``: a stream cut after it had started (its gateway died mid-stream): not
  retried (tokens were delivered), reported apart;
- ``malformed``: an answer that is not a well-formed error (no JSON error body).

A request is **lost** when it never completed and never started streaming within
``give_up_s`` of retries: accepted work dropped. Every attempt's failure is counted by kind.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Literal

import aiohttp

from services.bench.sse import StreamError, StreamState

Kind = Literal["ok", "retry", "final", "interrupted", "malformed"]
RETRY_STATUSES = frozenset({429, 502, 503, 504})


def well_formed_error(text: str) -> bool:
    """An OpenAI-style error body: ``{"error": {"message": "...", ...}}``."""
    try:
        obj = json.loads(text)
    except ValueError:
        return False
    err = obj.get("error") if isinstance(obj, dict) else None
    return isinstance(err, dict) and isinstance(err.get("message"), str) and bool(err["message"])


def classify(status: int | None, body: str, started: bool, stream_error: str | None) -> Kind:
    """One attempt's outcome. ``status`` None: no HTTP answer (connection refused/reset);
    ``started``: a token had streamed; ``stream_error``: why the stream broke (None = it
    ended with [DONE])."""
    if status is None:
        return "retry"
    if status == 200:
        if stream_error is None:
            return "ok"
        if stream_error.startswith("error event"):
            return "final"
        return "interrupted" if started else "retry"
    if not well_formed_error(body):
        return "malformed"
    return "retry" if status in RETRY_STATUSES and not started else "final"


@dataclass
class LoadReport:
    sent: int = 0
    completed: int = 0
    retried: int = 0  # requests that needed more than one attempt
    lost: int = 0
    final_errors: int = 0
    interrupted: int = 0
    malformed: int = 0
    attempt_errors: Counter[str] = field(default_factory=Counter)  # failed attempts by kind
    ok_starts: list[float] = field(default_factory=list)  # when each completed one was sent

    def completed_since(self, t: float) -> int:
        """Requests sent at or after ``t`` (monotonic) that completed."""
        return sum(1 for s in self.ok_starts if s >= t)

    def as_json(self) -> dict[str, Any]:
        return {
            "requests_sent": self.sent,
            "completed": self.completed,
            "retried": self.retried,
            "lost": self.lost,
            "final_errors": self.final_errors,
            "interrupted_after_start": self.interrupted,
            "malformed": self.malformed,
            "errors_by_kind": dict(sorted(self.attempt_errors.items())),
        }


def _error_kind(
    status: int | None, exc: BaseException | None, stream_error: str | None, started: bool
) -> str:
    if status is None:
        return f"connection: {type(exc).__name__}" if exc is not None else "connection"
    if status == 200:
        when = "after" if started else "before"
        return f"stream: {(stream_error or '?').split(':')[0]} {when} the first token"
    return f"http {status}"


class Load:
    """``workers`` clients sending requests back to back to ``base`` until stopped."""

    def __init__(self, base: str, workers: int = 4, give_up_s: float = 60.0) -> None:
        self.base = base
        self.workers = workers
        self.give_up_s = give_up_s
        self.report = LoadReport()
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._worker(w)) for w in range(self.workers)]

    async def stop(self) -> LoadReport:
        """Let each worker finish its current request (with its retries), then return."""
        self._stop.set()
        await asyncio.gather(*self._tasks)
        return self.report

    async def _worker(self, w: int) -> None:
        timeout = aiohttp.ClientTimeout(total=30)
        # a fresh connection per request, as many clients behind a balancer would
        connector = aiohttp.TCPConnector(force_close=True)
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            n = 0
            while not self._stop.is_set():
                n += 1
                prompt = " ".join(f"chaos{w % 2}p{i}" for i in range(96)) + f" turn{n}"
                await self.request(session, prompt)

    async def request(self, session: aiohttp.ClientSession, prompt: str) -> Kind:
        """One logical request, retried until it completes, fails for good, or give_up_s."""
        body = {
            "model": "tideserve-sim",
            "prompt": prompt,
            "max_tokens": 8,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        self.report.sent += 1
        started = time.monotonic()
        deadline = started + self.give_up_s
        attempts = 0
        delay = 0.1
        while True:
            attempts += 1
            kind = await self._attempt(session, body)
            if kind != "retry" or time.monotonic() > deadline:
                break
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)
        if attempts > 1:
            self.report.retried += 1
        if kind == "ok":
            self.report.completed += 1
            self.report.ok_starts.append(started)
        elif kind == "retry":
            self.report.lost += 1
        elif kind == "final":
            self.report.final_errors += 1
        elif kind == "interrupted":
            self.report.interrupted += 1
        else:
            self.report.malformed += 1
        return kind

    async def _attempt(self, session: aiohttp.ClientSession, body: dict[str, Any]) -> Kind:
        state = StreamState(time.monotonic())
        status: int | None = None
        text = ""
        stream_error: str | None = None
        exc: BaseException | None = None
        try:
            async with session.post(self.base + "/v1/completions", json=body) as resp:
                status = resp.status
                if status != 200:
                    text = await resp.text(errors="replace")
                else:
                    async for raw in resp.content:
                        state.feed_line(raw.decode("utf-8", "replace"), time.monotonic())
        except StreamError as err:
            stream_error = f"error event: {err}"
        except (aiohttp.ClientError, TimeoutError, OSError) as err:
            exc = err
            if status == 200:
                stream_error = f"cut: {type(err).__name__}"
            else:
                status = None
        outcome = state.finish(time.monotonic(), stream_error)
        started = outcome.ttft_s is not None
        kind = classify(status, text, started, outcome.error if status == 200 else None)
        if kind != "ok":
            self.report.attempt_errors[_error_kind(status, exc, outcome.error, started)] += 1
        return kind
