"""The load generator: replays trace arrivals against OpenAI-compatible targets (aiohttp).

Thin shell over the pure parts (``traces``, ``prompts``, ``sse``, ``stats``, ``cpu``).
``run_bench`` validates nothing itself: callers load and validate the whole trace first
(``traces.load_trace``), so a bad trace never sends a request. It then asks the first
target for a model when none is given (``BenchError`` if that fails: still nothing sent),
replays arrivals (``arrival_s / (speedup * rate_scale)``), spreads requests round-robin over
the targets, streams each response and returns the summary and the per-request results.
A request that fails (HTTP error, transport error, broken stream, missing ``[DONE]``,
timeout) is counted as failed with its reason; the run itself never raises for it.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, TextIO

import aiohttp

from services.bench.cpu import CpuSampler
from services.bench.sse import StreamError, StreamState
from services.common.bench.prompts import PromptSynthesizer
from services.common.bench.stats import RequestResult, infinite_cache_hit_ratio, summarize
from services.common.bench.traces import Trace, TraceRequest
from services.common.tasks import pause
from services.common.tokens import ModelDirError, load_model_tokenizer

Api = Literal["chat", "completions"]
Sessions = Literal["none", "first-block"]
SESSIONS: tuple[Sessions, ...] = ("none", "first-block")

SESSION_HEADER = "X-Tideserve-Session"  # the gateway's own session header (docs/agents.md)
JSON_HEADERS = {"Content-Type": "application/json"}


class BenchError(Exception):
    """The benchmark cannot start (bad configuration or unreachable target)."""


@dataclass(frozen=True)
class BenchConfig:
    """Options of one run; see ``tideserve bench --help`` for their meaning."""

    targets: tuple[str, ...]
    model: str | None = None
    api: Api = "chat"
    speedup: float = 1.0
    rate_scale: float = 1.0
    max_requests: int | None = None
    duration_s: float | None = None
    concurrency_limit: int | None = None
    timeout_s: float = 600.0
    seed: int = 0
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None
    trace_time: bool = False
    cpu_interval_s: float = 1.0
    extra_body: dict[str, Any] = field(default_factory=dict)
    # "first-block": each request names its session (session_header), its first hash id.
    sessions: Sessions = "none"
    # The served model's directory: prompts of its single-token words (see prompts.py).
    model_path: str | None = None

    @property
    def time_scale(self) -> float:
        """Wall seconds to reported seconds: the engines' speedup in trace time, else 1."""
        return self.speedup if self.trace_time else 1.0

    def __post_init__(self) -> None:
        if not self.targets:
            raise BenchError("at least one --target is required")
        for name in ("speedup", "rate_scale", "timeout_s", "cpu_interval_s"):
            if not getattr(self, name) > 0:
                raise BenchError(f"{name} must be positive, got {getattr(self, name)}")
        for name in ("max_requests", "concurrency_limit"):
            v = getattr(self, name)
            if v is not None and v <= 0:
                raise BenchError(f"{name} must be positive, got {v}")
        if self.duration_s is not None and self.duration_s <= 0:
            raise BenchError(f"duration_s must be positive, got {self.duration_s}")


def model_words(model_path: str | None) -> list[str] | None:
    """The single-token words of the model at ``model_path`` (None = no model). Raises
    BenchError for an unusable directory."""
    if model_path is None:
        return None
    try:
        words = load_model_tokenizer(model_path).single_token_words()
    except ModelDirError as e:
        raise BenchError(str(e)) from None
    if not words:
        raise BenchError(f"the tokenizer at {model_path} has no single-token words")
    return words


def normalize_target(url: str) -> str:
    """Base URL without a trailing slash or ``/v1`` (requests go to ``{base}/v1/...``)."""
    base = url.strip().rstrip("/")
    if base.endswith("/v1"):
        base = base[:-3]
    if not base.startswith(("http://", "https://")):
        raise BenchError(f"target must be an http(s) URL, got {url!r}")
    return base


def select_requests(trace: Trace, max_requests: int | None = None) -> list[TraceRequest]:
    """The first ``max_requests`` requests of the trace (all when None)."""
    reqs = list(trace.requests)
    return reqs[:max_requests] if max_requests is not None else reqs


def arrival_offsets(
    requests: Sequence[TraceRequest], speedup: float, rate_scale: float
) -> list[float]:
    """Send times in seconds from the start: trace time compressed by speedup x rate_scale."""
    k = speedup * rate_scale
    t0 = requests[0].arrival_s if requests else 0.0
    return [(r.arrival_s - t0) / k for r in requests]


def build_body(req: TraceRequest, prompt: str, model: str, api: Api) -> dict[str, Any]:
    """The request body: streamed, exactly ``output_length`` tokens (at least 1)."""
    n_out = max(1, req.output_length)
    body: dict[str, Any] = {
        "model": model,
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": n_out,
        "min_tokens": n_out,
        "ignore_eos": True,
        "temperature": 0.0,
    }
    if api == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    return body


async def fetch_model(session: aiohttp.ClientSession, target: str, timeout_s: float) -> str:
    """The first model id listed by ``{target}/v1/models``. Raises BenchError."""
    url = f"{target}/v1/models"
    try:
        async with asyncio.timeout(timeout_s), session.get(url) as resp:
            if resp.status != 200:
                raise BenchError(f"GET {url} returned HTTP {resp.status}; pass --model")
            data = await resp.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, json.JSONDecodeError) as exc:
        raise BenchError(f"cannot list models at {url} ({exc or type(exc).__name__})") from None
    models = data.get("data") if isinstance(data, dict) else None
    if not isinstance(models, list) or not models or not isinstance(models[0], dict):
        raise BenchError(f"GET {url} listed no models; pass --model")
    return str(models[0].get("id"))


def _http_error(status: int, text: str) -> str:
    msg = text.strip()[:200]
    try:
        obj = json.loads(text)
        err = obj.get("error") if isinstance(obj, dict) else None
        if isinstance(err, dict) and err.get("message"):
            msg = str(err["message"])[:200]
        elif isinstance(err, str):
            msg = err[:200]
    except json.JSONDecodeError:
        pass
    return f"http {status}: {msg}" if msg else f"http {status}"


def session_header(req: TraceRequest, sessions: Sessions) -> dict[str, str]:
    """The session header of ``req``: with ``first-block``, its first hash id (the agentic
    traces' sessions: every turn of a session starts with the session's first block, and no
    two sessions share one); nothing for ``none`` or a request without hash ids."""
    if sessions == "first-block" and req.hash_ids:
        return {SESSION_HEADER: f"trace-{req.hash_ids[0]}"}
    return {}


async def send_one(
    session: aiohttp.ClientSession,
    target: str,
    api: Api,
    payload: bytes,
    req: TraceRequest,
    scheduled_s: float,
    t0: float,
    timeout_s: float,
    headers: Mapping[str, str] | None = None,
) -> RequestResult:
    """Send one streamed request and measure it; never raises for request failures.
    ``headers``: more request headers (a session's)."""
    path = "/v1/chat/completions" if api == "chat" else "/v1/completions"
    sent = time.perf_counter()
    state = StreamState(sent)
    error: str | None = None
    try:
        async with asyncio.timeout(timeout_s):
            async with session.post(
                target + path, data=payload, headers={**JSON_HEADERS, **(headers or {})}
            ) as resp:
                if resp.status != 200:
                    error = _http_error(resp.status, await resp.text(errors="replace"))
                else:
                    async for raw in resp.content:
                        state.feed_line(raw.decode("utf-8", "replace"), time.perf_counter())
    except StreamError as exc:
        error = str(exc)
    except TimeoutError:
        error = f"timeout after {timeout_s:g}s"
    except aiohttp.ClientPayloadError as exc:
        error = f"broken stream: {exc}"
    except aiohttp.ClientError as exc:
        error = f"connection error: {type(exc).__name__}: {exc}"
    except (ValueError, UnicodeError, OSError) as exc:  # e.g. an oversized SSE line
        error = f"client error: {type(exc).__name__}: {exc}"
    out = state.finish(time.perf_counter(), error)
    return RequestResult(
        index=req.index,
        target=target,
        scheduled_s=scheduled_s,
        sent_s=sent - t0,
        input_length=req.input_length,
        output_length=req.output_length,
        error=out.error,
        ttft_s=out.ttft_s,
        tpot_s=out.tpot_s,
        e2e_s=out.e2e_s,
        output_tokens=out.output_tokens,
        prompt_tokens=out.prompt_tokens,
        cached_tokens=out.cached_tokens,
    )


class Progress:
    """A one-line progress bar on a terminal (stderr by default); silent otherwise."""

    def __init__(self, total: int, stream: TextIO | None = None) -> None:
        self.total = total
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = bool(getattr(self.stream, "isatty", lambda: False)())
        self.done = self.failed = self.inflight = 0

    def render(self, elapsed: float) -> str:
        width = 30
        filled = int(width * self.done / self.total) if self.total else width
        return (
            f"\r[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} "
            f"failed {self.failed} in-flight {self.inflight} {elapsed:.0f}s "
        )

    def update(self, elapsed: float) -> None:
        if self.enabled:
            self.stream.write(self.render(elapsed))
            self.stream.flush()

    def close(self, elapsed: float) -> None:
        if self.enabled:
            self.stream.write(self.render(elapsed) + "\n")
            self.stream.flush()


async def _replay(
    session: aiohttp.ClientSession,
    requests: Sequence[TraceRequest],
    cfg: BenchConfig,
    model: str,
    synth: PromptSynthesizer,
    on_tick: Callable[[float], None],
    progress: Progress,
) -> tuple[list[RequestResult], float, int]:
    targets = [normalize_target(t) for t in cfg.targets]
    offsets = arrival_offsets(requests, cfg.speedup, cfg.rate_scale)
    sem = asyncio.Semaphore(cfg.concurrency_limit) if cfg.concurrency_limit else None
    results: list[RequestResult] = []
    tasks: set[asyncio.Task[None]] = set()
    t0 = time.perf_counter()
    stop_ticker = asyncio.Event()

    async def ticker() -> None:
        while not stop_ticker.is_set():
            on_tick(time.perf_counter() - t0)
            await pause(stop_ticker, cfg.cpu_interval_s)

    async def run_one(payload: bytes, req: TraceRequest, target: str, at: float) -> None:
        try:
            r = await send_one(
                session, target, cfg.api, payload, req, at, t0, cfg.timeout_s,
                session_header(req, cfg.sessions),
            )  # fmt: skip
        finally:
            if sem is not None:
                sem.release()
        results.append(r)
        progress.inflight -= 1
        progress.done += 1
        progress.failed += 0 if r.ok else 1

    tick_task = asyncio.create_task(ticker())
    not_sent = 0
    try:
        for i, (req, at) in enumerate(zip(requests, offsets, strict=True)):
            if cfg.duration_s is not None and at >= cfg.duration_s:
                not_sent = len(requests) - i
                break
            # Build the body before waiting, so its cost stays outside the measured span.
            body = build_body(req, synth.prompt(req), model, cfg.api)
            body.update(cfg.extra_body)
            payload = json.dumps(body, separators=(",", ":")).encode()
            del body
            delay = t0 + at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if sem is not None:
                await sem.acquire()
            progress.inflight += 1
            task = asyncio.create_task(run_one(payload, req, targets[i % len(targets)], at))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            del payload
        if tasks:
            await asyncio.gather(*tasks)
    finally:
        for t in list(tasks):
            t.cancel()
        stop_ticker.set()
        await tick_task
    duration = time.perf_counter() - t0
    results.sort(key=lambda r: r.index)
    return results, duration, not_sent


async def run_bench(
    cfg: BenchConfig, trace: Trace, *, progress_stream: TextIO | None = None
) -> tuple[dict[str, Any], list[RequestResult]]:
    """Run the benchmark; returns (summary dict, per-request results). Raises BenchError."""
    targets = tuple(normalize_target(t) for t in cfg.targets)
    requests = select_requests(trace, cfg.max_requests)
    synth = PromptSynthesizer(
        seed=cfg.seed, block_tokens=trace.block_tokens, words=model_words(cfg.model_path)
    )
    connector = aiohttp.TCPConnector(limit=0)
    # No session-wide total timeout (aiohttp's default is 300 s): send_one bounds each
    # request by --timeout itself.
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=30.0)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        model = cfg.model or await fetch_model(session, targets[0], min(cfg.timeout_s, 30.0))
        sampler = CpuSampler(cfg.cpu_interval_s)
        progress = Progress(len(requests), progress_stream)

        def on_tick(elapsed: float) -> None:
            sampler.sample()
            progress.update(elapsed)

        results, wall, not_sent = await _replay(
            session, requests, cfg, model, synth, on_tick, progress
        )
        sampler.sample()
        progress.close(wall)
    summary = summarize(
        results,
        duration_s=wall,
        slo_ttft_ms=cfg.slo_ttft_ms,
        slo_tpot_ms=cfg.slo_tpot_ms,
        time_scale=cfg.time_scale,
    )
    per_target: dict[str, Counter[str]] = {t: Counter() for t in targets}
    for r in results:
        per_target[r.target]["completed" if r.ok else "failed"] += 1
    sent = requests[: len(requests) - not_sent]
    summary.update(
        {
            "infinite_cache_hit_ratio": infinite_cache_hit_ratio(sent, trace.block_tokens),
            "not_sent": not_sent,
            "output_length_mismatch": sum(
                1 for r in results if r.ok and r.output_tokens != max(1, r.output_length)
            ),
            "wall_duration_s": round(wall, 6),
            "time_base": "trace" if cfg.trace_time else "wall",
            "targets": {t: dict(c) for t, c in per_target.items()},
            "cpu": sampler.assess(),
            "trace": {
                "path": trace.path,
                "format": trace.format,
                "requests_in_file": len(trace.requests),
                "requests_replayed": len(requests),
                "span_s": round(requests[-1].arrival_s - requests[0].arrival_s, 3)
                if requests
                else 0.0,
                "mean_input_tokens": round(
                    sum(r.input_length for r in requests) / max(1, len(requests)), 1
                ),
                "mean_output_tokens": round(
                    sum(r.output_length for r in requests) / max(1, len(requests)), 1
                ),
            },
            "config": {**asdict(cfg), "targets": list(targets), "model": model},
        }
    )
    return summary, results
