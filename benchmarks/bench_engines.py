"""Trace benchmark against a fleet of simulated engines.

Starts N aggregated engines (``tideserve engine`` subprocesses on free ports), waits for
their ``/health``, runs ``tideserve bench`` on the first requests of the Mooncake
conversation trace with one ``--target`` per engine (round-robin), prints the summary JSON
and writes it to ``--out``. The engines and the bench run at the same ``--speedup`` and the
bench reports in trace time (``--trace-time``), so latencies are those of the modelled
hardware, not of this machine. A CPU-saturated run is flagged in the JSON (``cpu.saturated``)
and by a warning: lower ``--speedup`` then.

    .venv/bin/python benchmarks/bench_engines.py --engines 4 --max-requests 500 \\
        --speedup 2 --out /tmp/bench_engines.json

Nothing is hard-coded: every figure comes from the run. Exit code: the bench's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shlex
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TRACE = ROOT.parent / "shared" / "traces" / "mooncake_conversation_trace.jsonl"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"engine at {url} exited with code {proc.returncode}")
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(url + "/health", timeout=1.0) as resp:
                if resp.status == 200:
                    return
        time.sleep(0.2)
    raise RuntimeError(f"engine at {url} not healthy after {timeout_s:g}s")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--engines", type=int, default=4, help="number of aggregated engines")
    p.add_argument("--trace", default=str(DEFAULT_TRACE), help="Mooncake JSONL trace")
    p.add_argument("--max-requests", type=int, default=500)
    p.add_argument("--speedup", type=float, default=2.0, help="engines and trace replay")
    p.add_argument("--rate-scale", type=float, default=1.0)
    p.add_argument("--profile", default=None, help="engine hardware/model profile")
    p.add_argument("--stream-interval", type=int, default=8, help="engine tokens per chunk")
    p.add_argument("--slo-ttft-ms", type=float, default=2000.0)
    p.add_argument("--slo-tpot-ms", type=float, default=100.0)
    p.add_argument(
        "--engine-arg", action="append", default=[], help="extra engine flag (repeatable)"
    )
    p.add_argument("--out", default="bench_engines.json", help="summary JSON path")
    p.add_argument("--log-dir", default=None, help="engine logs (default: a temp dir)")
    args = p.parse_args(argv)

    log_dir = Path(args.log_dir or tempfile.mkdtemp(prefix="tideserve-bench-engines-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    procs: list[subprocess.Popen[bytes]] = []
    targets: list[str] = []
    try:
        for i in range(args.engines):
            port = free_port()
            cmd = [
                sys.executable, "-m", "services.cli", "engine",
                "--port", str(port),
                "--instance-id", f"bench-{i}",
                "--speedup", str(args.speedup),
                "--stream-interval", str(args.stream_interval),
                "--state-dir", str(log_dir / f"engine-{i}"),
            ]  # fmt: skip
            if args.profile:
                cmd += ["--profile", args.profile]
            for extra in args.engine_arg:
                cmd += shlex.split(extra)
            log = (log_dir / f"engine-{i}.log").open("wb")
            procs.append(subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT))
            targets.append(f"http://127.0.0.1:{port}")
        for url, proc in zip(targets, procs, strict=True):
            wait_healthy(url, proc, 60.0)
        bench = [
            sys.executable, "-m", "services.cli", "bench",
            "--trace", args.trace,
            "--max-requests", str(args.max_requests),
            "--speedup", str(args.speedup),
            "--rate-scale", str(args.rate_scale),
            "--trace-time",
            "--slo-ttft-ms", str(args.slo_ttft_ms),
            "--slo-tpot-ms", str(args.slo_tpot_ms),
            "--out", args.out,
        ]  # fmt: skip
        for t in targets:
            bench += ["--target", t]
        print("engines:", " ".join(targets), f"(logs in {log_dir})", file=sys.stderr)
        print("bench:", shlex.join(bench), file=sys.stderr)
        handles = [psutil.Process(proc.pid) for proc in procs]
        before = [sum(h.cpu_times()[:2]) for h in handles]
        started = time.monotonic()
        code = subprocess.run(bench, cwd=ROOT, stdout=subprocess.DEVNULL).returncode
        wall = time.monotonic() - started
        used = [sum(h.cpu_times()[:2]) - b for h, b in zip(handles, before, strict=True)]
        if code == 2:
            return code
        summary = json.loads(Path(args.out).read_text(encoding="utf-8"))
        # Who used the CPU: the engines' own share, to read next to the bench's cpu block.
        summary["fleet"] = {
            "engines": args.engines,
            "speedup": args.speedup,
            "stream_interval": args.stream_interval,
            "profile": args.profile or "engine default",
            "engine_cpu_s": [round(u, 2) for u in used],
            "engines_cpu_percent_of_machine": round(
                100.0 * sum(used) / (wall * (psutil.cpu_count() or 1)), 1
            ),
            "command": shlex.join([Path(sys.executable).name, *sys.argv]),
        }
        Path(args.out).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
        print(json.dumps(summary, indent=2))
        return code
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


if __name__ == "__main__":
    sys.exit(main())
