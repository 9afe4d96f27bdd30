"""Added latency and maximum throughput of a router in front of an upstream that is never the
bottleneck.

The upstream is nginx (Debian package ``nginx``) serving canned engine answers from a config
generated in a temp dir: ``/health``, ``/metrics`` (SGLang names, zero load), server/model
info, ``/v1/models``, a non-streaming ``/v1/completions`` JSON body, a streaming
``/v1/chat/completions`` SSE body (``--sse-chunks`` chunks + ``[DONE]``), and the same answer
as an engine serving the agent APIs natively streams it (``/v1/messages``, ``/v1/responses``).

Per open-loop phase (each ``--rates`` value, non-streaming and streaming): ``--repeats``
back-to-back pairs of runs, nginx directly then the router in front of it, each a fixed
inter-arrival load (1/rate, not waiting for answers) for ``--duration`` s after ``--warmup``
s, from a load generator in a separate process (raw asyncio HTTP/1.1 keep-alive client;
latency runs from writing a request to its response being complete; the generator's own send
lag is reported). Tideserve routers also get a ``messages_stream`` and a
``responses_stream`` phase per rate: the router is sent the streamed prompt as an Anthropic
``/v1/messages`` or OpenAI ``/v1/responses`` request, which it forwards as chat completions
and translates back, so its added latency includes the translation both ways (or, with
``--native-apis``, forwards as sent and relays as answered, as for engines that serve the
APIs themselves, such as vLLM). The direct side
asks nginx for the same API (``--direct-agent-apis native``: the client receives the same
bytes on both sides, and the baseline is an engine that speaks the API), or for the chat
stream the router translates from (``chat``: the client of the direct side reads a third of
the bytes). Added latency = router quantile - direct quantile of the same pair; the JSON
gives the median over the pairs (and each pair's p50 and p99), so that noise from other work
on a shared machine hits both sides alike. The phases of one rate take turns (one pair each
per round), and ``agent_apis_vs_chat`` gives the Messages and Responses phases' added p50/p99
and CPU per request as multiples of the streamed chat phase's. Maximum sustained req/s: closed loop with ``wrk``
(``--wrk-connections``, one thread, non-streaming), reported with the CPU the measured process
used and req/s per CPU-second of it (a multi-threaded router may use more than one core; our
gateway is one single-threaded process). ``--pin on`` instead moves every thread of the
measured process to CPU 0 and wrk to CPU 1 for that phase (off by default: on a machine shared
with other work, a pinned process cannot escape a busy core).

    apt-get install -y nginx wrk      # once, as root
    .venv/bin/python benchmarks/gateway_overhead.py --rates 200,1000 --repeats 3 \\
        --out /tmp/gateway_overhead.json

Exit code: 0, or 1 when nginx is missing. Every figure comes from the run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent))

from _canned_upstream import nginx_config
from _harness import (
    CpuMeter,
    MachineCpu,
    ProcGroup,
    command_line,
    free_port,
    has_verb,
    machine,
    sglang_router_python,
    tideserve,
    wait_http,
)
from _loadgen import loadgen_main, request_bytes

DEFAULT_ROUTERS = "tideserve:default,sglang:cache_aware,sglang:round_robin"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--routers", default=DEFAULT_ROUTERS, help="comma list of tideserve:<profile>"
                   " / sglang:<policy>")  # fmt: skip
    p.add_argument("--rates", default="200,1000", help="open-loop rates, req/s (comma list)")
    p.add_argument("--duration", type=float, default=5.0, help="seconds per open-loop run")
    p.add_argument("--warmup", type=float, default=1.0, help="seconds of load before measuring")
    p.add_argument("--prompt-words", type=int, default=128, help="prompt length (tokens)")
    p.add_argument("--sse-chunks", type=int, default=8, help="data: events in the canned stream")
    p.add_argument("--wrk-connections", type=int, default=64)
    p.add_argument("--wrk-duration", type=float, default=10.0)
    p.add_argument("--no-stream", action="store_true", help="skip the streaming phases")
    p.add_argument("--repeats", type=int, default=3, help="(direct, router) pairs per phase")
    p.add_argument(
        "--pin", choices=("auto", "on", "off"), default="off",
        help="max req/s: measured process on CPU 0, wrk on CPU 1 (auto: when 2+ cores); off "
             "by default: on a shared machine a pinned process cannot escape a busy core",
    )  # fmt: skip
    p.add_argument(
        "--gateway-arg", action="append", default=[],
        help="extra flag for every `tideserve gateway` (repeatable, shell-split)",
    )  # fmt: skip
    p.add_argument("--direct-agent-apis", choices=("native", "chat"), default="native",
                   help="the Messages and Responses phases' direct side: nginx streaming the "
                   "same answer in that API, as an engine serving it natively would (default), "
                   "or the chat stream the router translates from (the bytes differ)")  # fmt: skip
    p.add_argument("--native-apis", action="store_true",
                   help="Tideserve gateways forward Messages and Responses natively (nginx "
                   "answers them in kind) instead of translating to chat completions")  # fmt: skip
    p.add_argument("--out", default="gateway_overhead.json", help="summary JSON path")
    p.add_argument("--log-dir", default=None)
    return p.parse_args(argv)


def _taskset(cpu: int | None, cmd: list[str]) -> list[str]:
    return cmd if cpu is None or not shutil.which("taskset") else ["taskset", "-c", str(cpu), *cmd]


def open_loop(port: int, rate: float, stream: bool, args: argparse.Namespace,
              cpu: int | None, headers: Sequence[str] = (), api: str = "chat",
              ) -> dict[str, Any]:  # fmt: skip
    """One open-loop run from a load-generator process; ``headers``: extra ``Name: value``
    lines on every request; ``api`` "responses": streamed Responses API requests."""
    cmd = _taskset(cpu, [sys.executable, str(Path(__file__).resolve()), "_loadgen",
                         "--port", str(port), "--rate", str(rate), "--duration",
                         str(args.duration), "--warmup", str(args.warmup),
                         "--prompt-words", str(args.prompt_words)])  # fmt: skip
    for h in headers:
        cmd += ["--header", h]
    if stream:
        cmd.append("--stream")
    if api != "chat":
        cmd += ["--api", api]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.duration + 120)
    if done.returncode != 0:
        return {"error": done.stderr.strip()[-500:]}
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def wrk_max(port: int, args: argparse.Namespace, workdir: Path, cpu: int | None) -> dict[str, Any]:
    if not shutil.which("wrk"):
        return {"error": "wrk not installed (apt-get install -y wrk)"}
    raw = request_bytes("127.0.0.1", port, False, args.prompt_words)
    body = raw.split(b"\r\n\r\n", 1)[1].decode()
    script = workdir / "post.lua"
    script.write_text(
        'wrk.method = "POST"\nwrk.path = "/v1/completions"\n'
        'wrk.headers["Content-Type"] = "application/json"\n'
        f"wrk.body = {json.dumps(body)}\n",
        encoding="utf-8",
    )
    cmd = _taskset(cpu, ["wrk", "-t1", f"-c{args.wrk_connections}",
                         f"-d{int(args.wrk_duration)}s", "--latency", "-s", str(script),
                         f"http://127.0.0.1:{port}"])  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.wrk_duration + 60)
    text = done.stdout
    rps = re.search(r"Requests/sec:\s+([\d.]+)", text)
    non2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", text)
    errs = re.search(r"Socket errors: (.*)", text)
    lat = dict(re.findall(r"^\s+(50|99)%\s+(\S+)", text, re.M))
    return {
        "requests_per_s": float(rps.group(1)) if rps else None,
        "non_2xx": int(non2xx.group(1)) if non2xx else 0,
        "socket_errors": errs.group(1).strip() if errs else "",
        "latency_p50": lat.get("50"), "latency_p99": lat.get("99"),
        "connections": args.wrk_connections, "command": shlex.join(cmd),
    }  # fmt: skip


def _med(xs: list[float]) -> float | None:
    s = sorted(x for x in xs if x is not None)
    return round(s[len(s) // 2], 3) if s else None


def phases(args: argparse.Namespace, agent_apis: bool = False) -> list[tuple[str, float, bool, str]]:  # fmt: skip
    """(name, rate, stream, api) of every open-loop phase, e.g. ("200rps_nonstream", 200,
    False, "chat"); ``agent_apis``: also each rate's streamed Messages and Responses API
    phases ("200rps_messages_stream", "200rps_responses_stream": the router gets
    /v1/messages or /v1/responses, translated to the same streamed chat call the direct side
    makes, so the difference includes the translation)."""
    out = []
    for rate in [float(r) for r in args.rates.split(",") if r.strip()]:
        for stream in (False,) if args.no_stream else (False, True):
            out.append((f"{rate:g}rps_{'stream' if stream else 'nonstream'}", rate, stream, "chat"))
        if agent_apis and not args.no_stream:
            out.append((f"{rate:g}rps_messages_stream", rate, True, "messages"))
            out.append((f"{rate:g}rps_responses_stream", rate, True, "responses"))
    return out


def paired_open_loop(direct_port: int, router_port: int, router_pid: int,
                     args: argparse.Namespace, agent_apis: bool = False) -> dict[str, Any]:  # fmt: skip
    """Per phase, ``--repeats`` back-to-back (direct, router) pairs, so that noise from other
    work on the machine hits both sides alike. The phases of one rate take turns, one pair
    each per round, so that the streamed chat, Messages and Responses phases they are
    compared with see the same machine. Reports the median over repeats of each side's
    quantiles and of the paired differences (the added latency). ``agent_apis``: the
    Messages and Responses phases too (the router sent ``/v1/messages`` or ``/v1/responses``,
    nginx the chat stream)."""
    plan = phases(args, agent_apis)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name, *_ in plan}
    for rate in dict.fromkeys(r for _, r, _, _ in plan):
        for _ in range(args.repeats):
            for name, _, stream, api in (ph for ph in plan if ph[1] == rate):
                direct_api = api if args.direct_agent_apis == "native" else "chat"
                d = open_loop(direct_port, rate, stream, args, None, api=direct_api)
                meter, machine = CpuMeter([router_pid]), MachineCpu()
                r = open_loop(router_port, rate, stream, args, None, api=api)
                r["router_cpu"] = meter.read()
                r["machine_cores_busy"] = machine.read()
                runs[name].append({"direct": d, "router": r})
    return {name: summarize_phase(runs[name], rate, args) for name, rate, _, _ in plan}


def versus_chat(open_loop: dict[str, Any]) -> dict[str, Any]:
    """Per rate, the Messages and Responses phases' added latency (p50, p99) and router CPU
    per request as multiples of the streamed chat phase's (the target: within 1.2x)."""
    out: dict[str, Any] = {}
    for name, phase in open_loop.items():
        rate, _, api = name.partition("rps_")
        chat = open_loop.get(f"{rate}rps_stream")
        if api not in ("messages_stream", "responses_stream") or chat is None:
            continue
        ratios: dict[str, float | None] = {}
        for q in ("p50", "p99"):
            mine, base = phase["added_latency_ms"].get(q), chat["added_latency_ms"].get(q)
            ratios[f"added_{q}"] = round(mine / base, 3) if mine and base and base > 0 else None
        mine, base = phase["router"]["cpu_us_per_request"], chat["router"]["cpu_us_per_request"]
        ratios["cpu_per_request"] = round(mine / base, 3) if mine and base else None
        out.setdefault(f"{rate}rps", {})[api.removesuffix("_stream")] = ratios
    return out


def summarize_phase(runs: list[dict[str, Any]], rate: float, args: argparse.Namespace) -> dict[str, Any]:  # fmt: skip
    """One phase's figures from its (direct, router) pairs."""
    # A run whose every request failed (an overloaded router) has no quantiles: it
    # counts its errors, not its latency.
    ok = [x for x in runs if "error" not in x["direct"] and "error" not in x["router"]]
    measured = [
        x for x in ok
        if x["direct"]["latency_ms"]["p99"] is not None
        and x["router"]["latency_ms"]["p99"] is not None
    ]  # fmt: skip
    phase: dict[str, Any] = {"repeats": len(runs), "valid_repeats": len(ok)}
    for side in ("direct", "router"):
        phase[side] = {
            "latency_ms": {q: _med([x[side]["latency_ms"][q] for x in ok])
                           for q in ("p50", "p90", "p99")},
            "errors": sum(x[side]["errors"] for x in ok),
            "ok": sum(x[side]["ok"] for x in ok),
            "send_lag_p99_ms": _med([x[side]["send_lag_ms"]["p99"] for x in ok]),
        }  # fmt: skip
    phase["router"]["first_byte_ms_p50"] = _med([x["router"]["first_byte_ms"]["p50"] for x in ok])
    phase["router"]["cpu_percent_of_one_core"] = _med(
        [x["router"]["router_cpu"]["percent_of_one_core"] for x in ok]
    )
    # The whole machine's busy cores over the router's run (router, load generator,
    # nginx and anything else): near every core while the router is well below one
    # means the router was starved of CPU, and its latency is queueing for a core.
    phase["router"]["machine_cores_busy"] = _med([x["router"]["machine_cores_busy"] for x in ok])
    # CPU per request (robust to a loaded machine, unlike latency): the router's CPU
    # over the run (warm-up included) / the requests sent in it.
    sent = rate * (args.warmup + args.duration)
    phase["router"]["cpu_us_per_request"] = _med(
        [x["router"]["router_cpu"]["cpu_s"] * 1e6 / sent for x in ok]
    )
    phase["added_latency_ms"] = {
        q: _med([x["router"]["latency_ms"][q] - x["direct"]["latency_ms"][q] for x in measured])
        for q in ("p50", "p90", "p99")
    }
    phase["added_p50_per_repeat_ms"] = [
        round(x["router"]["latency_ms"]["p50"] - x["direct"]["latency_ms"]["p50"], 3)
        for x in measured
    ]
    phase["added_p99_per_repeat_ms"] = [
        round(x["router"]["latency_ms"]["p99"] - x["direct"]["latency_ms"]["p99"], 3)
        for x in measured
    ]
    errs = [x[s]["error"] for x in runs for s in ("direct", "router") if "error" in x[s]]
    if errs:
        phase["loadgen_errors"] = errs[:3]
    return phase


def pin_all_threads(pid: int, cpus: str) -> bool:
    """``taskset -a -p -c cpus pid`` (every thread of the process); False if unavailable."""
    if not shutil.which("taskset"):
        return False
    done = subprocess.run(["taskset", "-a", "-p", "-c", cpus, str(pid)], capture_output=True)
    return done.returncode == 0


def max_rps(port: int, pid: int, args: argparse.Namespace, workdir: Path,
            pin: bool) -> dict[str, Any]:  # fmt: skip
    """wrk closed loop; with ``pin`` the measured process runs on CPU 0 and wrk on CPU 1."""
    all_cpus = f"0-{(os.cpu_count() or 1) - 1}"
    pinned = pin and pin_all_threads(pid, "0")
    try:
        meter, machine = CpuMeter([pid]), MachineCpu()
        res = wrk_max(port, args, workdir, 1 if pinned else None)
        res["process_cpu"] = meter.read()
        res["machine_cores_busy"] = machine.read()
        res["process_pinned_to_cpu0"] = pinned
        busy = res["process_cpu"]["percent_of_one_core"] / 100.0
        rps = res.get("requests_per_s")
        res["requests_per_cpu_second"] = round(rps / busy, 1) if rps and busy > 0 else None
        return res
    finally:
        if pinned:
            pin_all_threads(pid, all_cpus)


def router_cmd(name: str, port: int, upstream: str, args: argparse.Namespace,
               py: Path | None) -> list[str]:  # fmt: skip
    kind, _, policy = name.partition(":")
    if kind == "tideserve":
        cmd = tideserve("gateway", "--host", "127.0.0.1", "--port", str(port),
                        "--endpoints", upstream, "--log-level", "WARNING")  # fmt: skip
        if policy and policy != "default":
            cmd += ["--profile", policy]
        for extra in args.gateway_arg:
            cmd += shlex.split(extra)
        return cmd
    if kind == "sglang" and py is not None:
        return [str(py), "-m", "sglang_router.launch_router", "--host", "127.0.0.1",
                "--port", str(port), "--worker-urls", upstream, "--policy",
                policy or "cache_aware", "--log-level", "warn",
                "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())]  # fmt: skip
    raise ValueError(f"cannot start router {name!r}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_loadgen"]:
        return loadgen_main(argv[1:])
    args = parse_args(argv)
    if args.native_apis:
        args.gateway_arg.append("--native-apis messages responses")
    if not shutil.which("nginx"):
        print("nginx is not installed (apt-get install -y nginx)", file=sys.stderr)
        return 1
    pin = args.pin == "on" or (args.pin == "auto" and (os.cpu_count() or 1) >= 2)
    workdir = Path(args.log_dir or tempfile.mkdtemp(prefix="tideserve-overhead-"))
    workdir.mkdir(parents=True, exist_ok=True)
    group = ProcGroup(workdir)
    summary: dict[str, Any] = {
        "benchmark": "gateway_overhead", "command": command_line(), "machine": machine(),
        "method": {
            "open_loop": f"fixed inter-arrival, {args.duration:g}s measured after "
                         f"{args.warmup:g}s warm-up, {args.repeats} (direct, router) pairs "
                         "per phase; figures are medians over the pairs",
            "max_rps": f"wrk -t1 -c{args.wrk_connections} {args.wrk_duration:g}s, "
                       "non-streaming" + (", process on CPU 0 and wrk on CPU 1" if pin else ""),
            "prompt_words": args.prompt_words, "sse_chunks": args.sse_chunks,
            "agent_apis_direct_side": args.direct_agent_apis,
            "agent_apis_forwarding": "native" if args.native_apis else "translated",
        },
    }  # fmt: skip
    routers = [r.strip() for r in args.routers.split(",") if r.strip()]
    py, reason = (None, "")
    if any(r.startswith("sglang:") for r in routers):
        py, reason = sglang_router_python()
    gateway_ok = has_verb("gateway")
    try:
        nport = free_port()
        conf = nginx_config(workdir, nport, args.sse_chunks)
        nginx = group.start("nginx", ["nginx", "-p", str(workdir), "-c", str(conf),
                                      "-e", "stderr"])  # fmt: skip
        upstream = f"http://127.0.0.1:{nport}"
        wait_http(upstream + "/health", group, 20.0)
        summary["upstream"] = {"nginx": upstream, "config": str(conf)}
        print("[direct] nginx max req/s", file=sys.stderr)
        summary["direct_max_rps"] = max_rps(nport, nginx.proc.pid, args, workdir, pin)
        summary["routers"] = {}
        for name in routers:
            print(f"[{name}]", file=sys.stderr)
            if name.startswith("sglang:") and py is None:
                summary["routers"][name] = {"error": reason}
                continue
            if name.startswith("tideserve:") and not gateway_ok:
                summary["routers"][name] = {"error": "`tideserve gateway` is not available"}
                continue
            rgroup = ProcGroup(workdir)
            try:
                port = free_port()
                cmd = router_cmd(name, port, upstream, args, py)
                router = rgroup.start(name.replace(":", "-"), cmd)
                wait_http(f"http://127.0.0.1:{port}/v1/models", rgroup, 60.0)
                time.sleep(2.0)  # let the router see the upstream healthy
                res: dict[str, Any] = {"command": shlex.join(cmd)}
                res["open_loop"] = paired_open_loop(
                    nport, port, router.proc.pid, args, agent_apis=name.startswith("tideserve:")
                )
                if name.startswith("tideserve:"):
                    res["agent_apis_vs_chat"] = versus_chat(res["open_loop"])
                res["max_rps"] = max_rps(port, router.proc.pid, args, workdir, pin)
                rgroup.check()
                summary["routers"][name] = res
            except (RuntimeError, OSError, ValueError) as err:
                summary["routers"][name] = {"error": str(err)}
            finally:
                rgroup.stop()
    finally:
        group.stop()
    summary["target"] = {}
    for name, r in summary.get("routers", {}).items():
        p99 = r.get("open_loop", {}).get("200rps_nonstream", {}).get("added_latency_ms", {})
        v = p99.get("p99") if p99 else None
        summary["target"][name] = {"added_p99_ms_200rps_nonstream": v,
                                   "met_lt_2ms": v is not None and v < 2.0}  # fmt: skip
    text = json.dumps(summary, indent=2)
    Path(args.out).write_text(text + "\n", encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
