"""Where the gateway's CPU goes, per request and per stage.

One ``tideserve gateway`` process in front of the same canned nginx upstream as
``gateway_overhead.py``, driven by its open-loop load generator (a process of its own) with
one workload at a time:

| workload | request |
|---|---|
| ``short`` | ``/v1/completions``, 128-token prompt, non-streaming (``gateway_overhead.py``'s) |
| ``short_stream`` | ``/v1/chat/completions``, 128-token message, streamed (8 SSE events) |
| ``messages_stream`` / ``responses_stream`` | the same message as a streamed ``/v1/messages`` / ``/v1/responses`` request (translated to chat and back) |
| ``long_8k`` / ``long_64k`` / ``long_128k`` | ``/v1/completions`` with an 8k/64k/128k-token prompt |
| ``agentic_64k`` | a streamed chat of an agent: system prompt, 5 tools offered, 24 rounds of assistant tool calls and tool results, ≈ 64k tokens |

Per workload, one run of ``--duration`` s (after ``--warmup`` s) at the workload's rate:

- **CPU µs per request**: the gateway process's user+system CPU over the run, minus its
  idle CPU (health probes, load scrapes; measured for 2 s before the first workload),
  divided by the requests sent. Robust to a loaded machine (CPU time is not wall time),
  unlike latency; ``system_share`` is the kernel's part (socket calls).
- **Stages**: the gateway runs under ``_cpu_sampler.py`` (a ``SIGPROF`` sampler, one sample
  per ``--sample-ms`` of the process's CPU time; ≈ 1 % overhead); each sample goes to one
  stage by :func:`stage_of` (the innermost frame of ours on its stack decides; samples
  without one go to the HTTP server, the upstream client or the event loop by library),
  and a stage's share of the samples times the CPU per request is its CPU µs per request.
  Statistical: a stage of a few % carries a few µs of noise.

    apt-get install -y nginx      # once, as root
    .venv/bin/python benchmarks/gateway_profile.py --out /tmp/gateway_profile.json

Prints one JSON object (also written to ``--out``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent))

import psutil
from _canned_upstream import start_canned_upstream
from _harness import (
    Child,
    ProcGroup,
    command_line,
    emit_json,
    free_port,
    http_get,
    machine,
    wait_http,
)
from _loadgen import MODEL, _loadgen, request_bytes
from gateway_overhead import router_cmd

# (name, rate req/s); the rates keep one process well below saturation on 2 shared cores.
WORKLOADS: dict[str, float] = {
    "short": 300.0,
    "short_stream": 300.0,
    "messages_stream": 300.0,
    "responses_stream": 300.0,
    "long_8k": 40.0,
    "long_64k": 6.0,
    "long_128k": 3.0,
    "agentic_64k": 6.0,
}
DEFAULT_WORKLOADS = ",".join(WORKLOADS)

# Innermost frame of ours → stage: (path fragment, function or "" for any, stage).
_OURS: tuple[tuple[str, str, str], ...] = (
    ("services/common/tokens/", "", "tokenize and hash"),
    ("services/scheduler/http/openai.py", "", "parse"),
    ("services/scheduler/admission/gate.py", "AdmissionGate.lookup", "prefix lookup"),
    ("services/scheduler/feeds/kvmeta_client.py", "", "prefix lookup"),
    ("services/scheduler/admission/", "", "admission"),
    ("services/common/admission/", "", "admission"),
    ("services/scheduler/core/intake.py", "", "admission"),
    ("services/scheduler/http/preemption.py", "", "admission"),
    ("services/common/routing/", "", "pick"),
    ("services/common/scheduling/service.py", "", "pick"),
    ("services/common/scheduling/fleet.py", "", "pick"),
    ("services/common/scheduling/load_merge.py", "", "pick"),
    ("services/scheduler/http/upstream.py", "", "forward"),
    ("services/scheduler/http/forward.py", "", "forward"),
    ("services/scheduler/http/relay.py", "", "relay"),
    ("services/scheduler/core/records.py", "", "record"),
    ("services/scheduler/core/tools.py", "", "record"),
    ("services/scheduler/core/genai.py", "", "record"),
    ("services/scheduler/http/records.py", "", "record"),
    ("services/scheduler/http/metrics.py", "", "record"),
    ("services/scheduler/feeds/record_sink.py", "", "record"),
    ("services/common/logs.py", "", "record"),
    ("services/common/otel.py", "", "tracing"),
    ("services/scheduler/http/server.py", "", "handler"),
    ("services/scheduler/compose.py", "", "handler"),
)
# No frame of ours: by library (path fragment, stage).
_LIBS: tuple[tuple[str, str], ...] = (
    ("aiohttp/client", "upstream client (aiohttp)"),
    ("aiohttp/connector.py", "upstream client (aiohttp)"),
    ("aiohttp/streams.py", "upstream client (aiohttp)"),
    ("aiohttp/", "HTTP server (aiohttp)"),
    ("opentelemetry/", "tracing"),
    ("prometheus_client/", "record"),
)


def stage_of(frames: Iterable[str]) -> str:
    """The stage of one sample (``frames`` root first, each ``qualname (path``)."""
    stack = [f.partition(" (") for f in frames]
    for name, _, path in reversed(stack):
        for fragment, func, stage in _OURS:
            if fragment in path and (not func or name == func):
                return stage
    for _, _, path in reversed(stack):
        for fragment, stage in _LIBS:
            if fragment in path:
                return stage
    return "event loop and other"


def stage_shares(raw: str) -> tuple[dict[str, float], int]:
    """Share of the samples per stage of a collapsed-stack file (lines
    ``frame;frame;... count``), and the sample count."""
    counts: Counter[str] = Counter()
    for line in raw.splitlines():
        stack, _, n = line.rpartition(" ")
        if stack and n.isdigit():
            counts[stage_of(stack.split(";"))] += int(n)
    total = sum(counts.values())
    return ({k: v / total for k, v in counts.most_common()} if total else {}), total


# -- requests ---------------------------------------------------------------------------------


def _http(port: int, path: str, body: dict[str, Any]) -> bytes:
    data = json.dumps(body).encode()
    head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json"
            f"\r\nContent-Length: {len(data)}\r\n\r\n")  # fmt: skip
    return head.encode() + data


def _words(n: int, start: int = 0) -> str:
    return " ".join(f"w{(start + i) % 9973}" for i in range(n))


def agentic_body(tokens: int, rounds: int = 24) -> dict[str, Any]:
    """An agent's turn: system prompt, tools, ``rounds`` tool calls with their results, the
    last results not yet answered; ≈ ``tokens`` whitespace tokens in all."""
    tools = [{"type": "function", "function": {"name": f"tool_{k}", "description": _words(20, k),
              "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}
             for k in range(5)]  # fmt: skip
    system = tokens // 16
    per = (tokens - system) // rounds
    msgs: list[dict[str, Any]] = [{"role": "system", "content": _words(system)},
                                  {"role": "user", "content": _words(64, 7)}]  # fmt: skip
    for r in range(rounds):
        call = {"id": f"call_{r}", "type": "function",
                "function": {"name": f"tool_{r % 5}", "arguments": json.dumps({"q": _words(8, r)})}}  # fmt: skip
        msgs.append({"role": "assistant", "content": None, "tool_calls": [call]})
        msgs.append({"role": "tool", "tool_call_id": f"call_{r}", "content": _words(per, r * per)})
    return {"model": MODEL, "messages": msgs, "tools": tools, "max_tokens": 8, "stream": True}


def workload_request(name: str, port: int) -> bytes:
    if name in ("short", "short_stream"):
        return request_bytes("127.0.0.1", port, name == "short_stream", 128)
    if name in ("messages_stream", "responses_stream"):
        return request_bytes("127.0.0.1", port, True, 128, api=name.removesuffix("_stream"))
    if name.startswith("long_"):
        n = int(name.removeprefix("long_").removesuffix("k")) * 1024
        return _http(
            port, "/v1/completions", {"model": MODEL, "prompt": _words(n), "max_tokens": 8}
        )
    if name == "agentic_64k":
        return _http(port, "/v1/chat/completions", agentic_body(64 * 1024))
    raise ValueError(f"unknown workload {name!r} (known: {DEFAULT_WORKLOADS})")


# -- runs -------------------------------------------------------------------------------------


def load(port: int, name: str, rate: float, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:  # fmt: skip
    req = workdir / f"{name}.http"
    req.write_bytes(workload_request(name, port))
    cmd = [sys.executable, str(Path(__file__).resolve()), "_load", "--port", str(port),
           "--request", str(req), "--rate", str(rate), "--duration", str(args.duration),
           "--warmup", str(args.warmup)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.duration + 120)
    if done.returncode != 0:
        return {"error": done.stderr.strip()[-500:]}
    out: dict[str, Any] = json.loads(done.stdout)
    return out


def _cpu(pid: int) -> tuple[float, float]:
    t = psutil.Process(pid).cpu_times()
    return t.user, t.system


def _statuses(port: int) -> dict[str, float]:
    """The gateway's answers so far by HTTP status (its requests counter)."""
    _, body = http_get(f"http://127.0.0.1:{port}/metrics")
    out: dict[str, float] = {}
    for line in body.decode(errors="replace").splitlines():
        m = re.match(r'tideserve_gateway_requests_total\{.*status="(\d+)".*\} (\S+)', line)
        if m:
            out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(2))
    return out


def measure(port: int, gw: Child, name: str, args: argparse.Namespace, workdir: Path,
            idle_cpu_per_s: float, dumps: int) -> dict[str, Any]:  # fmt: skip
    """One workload's run: CPU per request and, with the sampler (``dumps``: how many
    sample files the gateway wrote so far, -1 = no sampler), its split by stage."""
    pid = gw.proc.pid
    rate = WORKLOADS[name]
    body = workload_request(name, port)
    res: dict[str, Any] = {"rate": rate, "request_bytes": len(body)}
    if dumps >= 0:
        os.kill(pid, signal.SIGUSR1)  # samples so far (start-up, the previous gap) apart
    t0, (u0, s0) = time.monotonic(), _cpu(pid)
    run = load(port, name, rate, args, workdir)
    (u1, s1), wall = _cpu(pid), time.monotonic() - t0
    if "error" in run:
        return {**res, "error": run["error"]}
    requests = run["sent"] + round(rate * args.warmup)
    cpu = max(0.0, (u1 - u0) + (s1 - s0) - idle_cpu_per_s * wall)
    per = cpu / requests * 1e6
    res.update(ok=run["ok"], errors=run["errors"], latency_ms=run["latency_ms"],
               cpu_us_per_request=round(per, 1),
               system_share=round((s1 - s0) / max((u1 - u0) + (s1 - s0), 1e-9), 3),
               cpu_percent_of_one_core=round(100.0 * ((u1 - u0) + (s1 - s0)) / wall, 1))  # fmt: skip
    res["gateway_statuses_so_far"] = _statuses(port)
    if dumps >= 0:
        os.kill(pid, signal.SIGUSR1)
        raw = Path(f"{workdir / 'samples'}.{dumps + 1}")
        deadline = time.monotonic() + 10.0
        while not raw.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)  # written in one call; let it finish
        shares, samples = stage_shares(raw.read_text(encoding="utf-8"))
        res["samples"] = samples
        gcs = json.loads(Path(f"{raw}.gc").read_text(encoding="utf-8"))
        res["gc_us_per_request_inside_stages"] = round(sum(gcs["cpu_s"]) / requests * 1e6, 1)
        res["gc_runs_per_generation"] = gcs["runs"]
        res["stages_us_per_request"] = {k: round(v * per, 1) for k, v in shares.items()}
    return res


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--workloads", default=DEFAULT_WORKLOADS, help="comma list (see above)")
    p.add_argument("--duration", type=float, default=5.0, help="measured seconds per run")
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--no-stages", dest="stages", action="store_false",
                   help="no sampler in the gateway (CPU per request only)")  # fmt: skip
    p.add_argument("--sample-ms", type=float, default=1.0, help="CPU ms between samples")
    p.add_argument("--gateway-arg", action="append", default=[],
                   help="extra flag for `tideserve gateway` (repeatable, shell-split)")  # fmt: skip
    p.add_argument("--out", default=None, help="also write the JSON here")
    return p.parse_args(argv)


def load_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="gateway_profile.py _load")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--request", required=True, help="file with the raw HTTP request")
    p.add_argument("--rate", type=float, required=True)
    p.add_argument("--duration", type=float, required=True)
    p.add_argument("--warmup", type=float, default=1.0)
    a = p.parse_args(argv)
    raw = Path(a.request).read_bytes()
    pre = max(8, min(256, int(a.rate * 0.02)))
    out = asyncio.run(_loadgen("127.0.0.1", a.port, raw, a.rate, a.duration, a.warmup, pre))
    print(json.dumps(out))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_load"]:
        return load_main(argv[1:])
    args = parse_args(argv)
    if not shutil.which("nginx"):
        print("nginx is not installed (apt-get install -y nginx)", file=sys.stderr)
        return 1
    names = [n.strip() for n in args.workloads.split(",") if n.strip()]
    for n in names:
        if n not in WORKLOADS:
            print(f"unknown workload {n!r} (known: {DEFAULT_WORKLOADS})", file=sys.stderr)
            return 2
    workdir = Path(tempfile.mkdtemp(prefix="tideserve-gwprofile-"))
    group = ProcGroup(workdir)
    summary: dict[str, Any] = {"benchmark": "gateway_profile", "command": command_line(),
                               "machine": machine(), "workloads": {}}  # fmt: skip
    try:
        upstream = start_canned_upstream(group, workdir)
        port = free_port()
        ns = argparse.Namespace(gateway_arg=args.gateway_arg)
        cmd = router_cmd("tideserve:default", port, upstream, ns, None)
        if args.stages:  # the same command under the in-process CPU sampler
            sampler = [str(Path(__file__).resolve().with_name("_cpu_sampler.py")),
                       str(workdir / "samples"), "--interval-ms", str(args.sample_ms), "--"]  # fmt: skip
            cmd = [cmd[0], *sampler, *cmd[3:]]
        gw = group.start("gateway", cmd)
        wait_http(f"http://127.0.0.1:{port}/v1/models", group, 60.0)
        summary["gateway_command"] = shlex.join(cmd)
        time.sleep(1.0)
        before = sum(_cpu(gw.proc.pid))
        time.sleep(2.0)
        idle = (sum(_cpu(gw.proc.pid)) - before) / 2.0
        summary["idle_cpu_percent"] = round(idle * 100.0, 2)
        for k, name in enumerate(names):
            print(f"[{name}]", file=sys.stderr)
            dumps = 2 * k if args.stages else -1
            summary["workloads"][name] = measure(port, gw, name, args, workdir, idle, dumps)
            group.check()
        summary["loadavg_1m_after"] = round(os.getloadavg()[0], 2)
    finally:
        group.stop()
    emit_json(summary, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
