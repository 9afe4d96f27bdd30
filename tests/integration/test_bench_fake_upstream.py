"""``tideserve bench`` against a tiny OpenAI-compatible upstream written here.

The fake streams SSE chat completions with usage (coalescing two tokens a chunk, like an
engine with a stream interval), keeps an unbounded prefix cache of 512-token block hashes
to report cached tokens, and can fail: HTTP 500 on every Nth request, or a stream that
breaks before ``[DONE]``, or one that stalls.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from services.bench.client import BenchConfig, BenchError, run_bench
from services.common import tokens
from services.common.bench.traces import load_trace

DATA = Path(__file__).resolve().parents[1] / "data"
MOONCAKE = DATA / "mooncake_conversation_head.jsonl"
AZURE = DATA / "azure_conv_head.csv"


class FakeUpstream:
    """An aiohttp OpenAI-style server on a free port; ``mode`` picks a failure, if any."""

    def __init__(self, mode: str = "ok", fail_every: int = 3) -> None:
        self.mode = mode
        self.fail_every = fail_every
        self.received = 0
        self.seen_blocks: set[int] = set()
        self.bodies: list[dict[str, Any]] = []
        self.sessions: list[str | None] = []  # each request's X-Tideserve-Session
        self._runner: web.AppRunner | None = None
        self._release = asyncio.Event()
        self.url = ""

    async def start(self) -> str:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/chat/completions", self._chat)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert server is not None and server.sockets  # type: ignore[attr-defined]
        port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def stop(self) -> None:
        self._release.set()
        if self._runner is not None:
            await self._runner.cleanup()

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "fake-model"}]})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.received += 1
        n = self.received
        self.bodies.append({k: v for k, v in body.items() if k != "messages"})
        self.sessions.append(request.headers.get("X-Tideserve-Session"))
        if self.mode == "http500" and n % self.fail_every == 0:
            return web.json_response(
                {"error": {"message": "upstream exploded", "type": "server_error"}}, status=500
            )
        ids = tokens.tokenize(body["messages"][0]["content"])
        hashes = tokens.block_hashes(ids, 512)
        hit = 0
        for h in hashes:
            if h not in self.seen_blocks:
                break
            hit += 1
        self.seen_blocks.update(hashes)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        n_out = int(body["max_tokens"])
        sent = 0
        while sent < n_out:
            k = min(2, n_out - sent)
            words = " ".join(f"t{sent + j}" for j in range(k))
            chunk = {"choices": [{"index": 0, "delta": {"content": words + " "}}]}
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
            sent += k
            await asyncio.sleep(0.001)
            if self.mode == "stall" and n % self.fail_every == 0:
                await self._release.wait()  # until the test ends: the client times out
            if self.mode == "break" and n % self.fail_every == 0:
                await resp.write_eof()  # ends the stream without [DONE]
                return resp
        usage = {
            "prompt_tokens": len(ids),
            "completion_tokens": n_out,
            "prompt_tokens_details": {"cached_tokens": hit * 512},
        }
        await resp.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


@pytest.fixture
async def upstreams() -> Any:
    started: list[FakeUpstream] = []

    async def make(mode: str = "ok", fail_every: int = 3) -> FakeUpstream:
        up = FakeUpstream(mode, fail_every)
        await up.start()
        started.append(up)
        return up

    yield make
    for up in started:
        await up.stop()


STABLE_KEYS = [
    "completed",
    "failed",
    "duration_s",
    "request_throughput_rps",
    "output_token_throughput",
    "ttft_ms",
    "tpot_ms",
    "e2e_ms",
    "cache_hit_ratio",
    "goodput_rps",
    "slo_attainment",
]


async def test_bench_replays_mooncake_and_reports_cache_hits(upstreams: Any) -> None:
    up = await upstreams()
    trace = load_trace(MOONCAKE)
    cfg = BenchConfig(targets=(up.url,), speedup=200.0, max_requests=40, slo_ttft_ms=60_000)
    summary, results = await run_bench(cfg, trace)
    for key in STABLE_KEYS:
        assert key in summary
    for key in ("ttft_ms", "tpot_ms", "e2e_ms"):
        assert set(summary[key]) == {"mean", "p50", "p90", "p99"}
        assert summary[key]["p50"] is not None
    assert (summary["completed"], summary["failed"], up.received) == (40, 0, 40)
    assert summary["output_tokens"] == sum(max(1, r.output_length) for r in trace.requests[:40])
    assert summary["output_length_mismatch"] == 0
    assert summary["config"]["model"] == "fake-model"
    # The trace slice reuses prefixes; the fake's unbounded cache sees that reuse.
    assert 0 < summary["cache_hit_ratio"] <= summary["infinite_cache_hit_ratio"] + 1e-9
    assert summary["slo_attainment"] == 1.0
    assert summary["cpu"]["samples"] >= 1 and "saturated" in summary["cpu"]
    assert up.bodies[0]["max_tokens"] == up.bodies[0]["min_tokens"] == 500
    assert up.bodies[0]["ignore_eos"] is True
    assert all(r.tpot_s is not None for r in results if r.output_tokens >= 2)


async def test_bench_spreads_requests_round_robin_over_targets(upstreams: Any) -> None:
    a, b = await upstreams(), await upstreams()
    cfg = BenchConfig(targets=(a.url, b.url + "/v1/"), model="m", speedup=500.0, max_requests=9)
    summary, results = await run_bench(cfg, load_trace(AZURE))
    assert (a.received, b.received) == (5, 4)
    assert summary["targets"] == {a.url: {"completed": 5}, b.url: {"completed": 4}}
    assert [r.target for r in results[:4]] == [a.url, b.url, a.url, b.url]
    assert summary["infinite_cache_hit_ratio"] == 0.0


@pytest.mark.parametrize(
    ("mode", "reason"),
    [
        ("http500", "http 500: upstream exploded"),
        ("break", "stream ended without [DONE]"),
        ("stall", "timeout after 3s"),
    ],
    ids=["http-error", "broken-stream", "stalled-stream"],
)
async def test_failing_upstream_counts_failures_with_reasons(
    upstreams: Any, mode: str, reason: str
) -> None:
    up = await upstreams(mode, fail_every=3)
    cfg = BenchConfig(
        targets=(up.url,),
        model="m",
        speedup=500.0,
        max_requests=9,
        timeout_s=3.0 if mode == "stall" else 600.0,
    )
    summary, _ = await run_bench(cfg, load_trace(AZURE))
    assert (summary["completed"], summary["failed"]) == (6, 3)
    assert summary["errors"] == {reason: 3}
    assert summary["slo_attainment"] == pytest.approx(6 / 9)


@pytest.mark.parametrize("sessions", ["none", "first-block"], ids=["none", "first-block"])
async def test_sessions_are_named_by_their_first_block(
    upstreams: Any, sessions: str, tmp_path: Path
) -> None:
    up = await upstreams()
    first = [7, 9, 7, 11, 9, 7]  # three sessions' turns, interleaved as agents' are
    lines = [
        {"timestamp": 10 * i, "input_length": 512 * (i + 1), "output_length": 4,
         "hash_ids": [f, *range(100 * i, 100 * i + i)]}
        for i, f in enumerate(first)
    ]  # fmt: skip
    path = tmp_path / "agentic.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    cfg = BenchConfig(targets=(up.url,), model="m", speedup=500.0, sessions=sessions)  # type: ignore[arg-type]
    await run_bench(cfg, load_trace(path))
    want = [f"trace-{f}" if sessions == "first-block" else None for f in first]
    assert Counter(up.sessions) == Counter(want)


async def test_unreachable_target_fails_before_sending(upstreams: Any) -> None:
    up = await upstreams()
    await up.stop()
    cfg = BenchConfig(targets=(up.url,), speedup=500.0, max_requests=3)
    with pytest.raises(BenchError, match="cannot list models"):
        await run_bench(cfg, load_trace(AZURE))


async def test_concurrency_limit_and_duration_bound_the_run(upstreams: Any) -> None:
    up = await upstreams()
    # Azure slice at x5: --duration 1 (wall) keeps the first 5 s of the trace only.
    trace = load_trace(AZURE)
    cfg = BenchConfig(
        targets=(up.url,), model="m", speedup=5.0, duration_s=1.0, concurrency_limit=1
    )
    summary, _ = await run_bench(cfg, trace)
    expect = sum(1 for r in trace.requests if r.arrival_s < 5.0)
    assert summary["completed"] == up.received == expect
    assert summary["not_sent"] == len(trace.requests) - expect


async def _cli(*args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "services.bench",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_cli_writes_json_and_markdown(upstreams: Any, tmp_path: Path) -> None:
    up = await upstreams()
    out_file, rec_file = tmp_path / "run.json", tmp_path / "requests.jsonl"
    code, out, err = await _cli(
        "--trace", str(MOONCAKE), "--target", up.url, "--max-requests", "5",
        "--speedup", "500", "--out", str(out_file), "--markdown",
        "--requests-out", str(rec_file),
    )  # fmt: skip
    assert code == 0, err
    data = json.loads(out_file.read_text())
    assert [k for k in data if k in STABLE_KEYS] == STABLE_KEYS
    assert data["completed"] == 5
    assert "| TTFT |" in out and "| completed | 5 |" in out
    recs = [json.loads(line) for line in rec_file.read_text().splitlines()]
    assert [r["index"] for r in recs] == [0, 1, 2, 3, 4]
    assert all(r["error"] is None and r["ttft_ms"] > 0 for r in recs)
    assert sum(r["output_tokens"] for r in recs) == data["output_tokens"]


async def test_cli_malformed_trace_names_the_line_and_sends_nothing(
    upstreams: Any, tmp_path: Path
) -> None:
    up = await upstreams()
    bad = tmp_path / "bad.jsonl"
    lines = MOONCAKE.read_text().splitlines()[:10]
    lines[6] = lines[6].replace('"output_length"', '"output_len"')
    bad.write_text("\n".join(lines) + "\n")
    code, _, err = await _cli("--trace", str(bad), "--target", up.url, "--speedup", "500")
    assert code == 2
    assert f"{bad}:7: missing field 'output_length'" in err
    assert up.received == 0


async def test_cli_plot_without_matplotlib_is_a_clear_error(upstreams: Any, tmp_path: Path) -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("matplotlib is installed here; this checks the error when it is missing")
    up = await upstreams()
    code, _, err = await _cli(
        "--trace", str(AZURE), "--target", up.url, "--plot", str(tmp_path / "p.png")
    )
    assert code == 2
    assert "--plot needs matplotlib" in err
    assert up.received == 0
