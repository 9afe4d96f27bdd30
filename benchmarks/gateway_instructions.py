"""The gateway's CPU cost per request in instructions, which machine noise does not move.

Wall-clock and CPU-time figures on a shared 2-core machine move by tens of percent with
whatever else runs; instruction counts do not. This runs ``tideserve gateway`` under
Valgrind's callgrind (Debian package ``valgrind``) in front of ``gateway_overhead.py``'s
canned nginx upstream, with instrumentation off until the load starts. Per round and API,
it zeroes the counters, turns instrumentation on, sends ``--requests`` requests one after
another over one keep-alive connection (after ``--warmup`` unmeasured ones), turns it off
and dumps; the instructions of the dump divided by the requests is that API's cost. An idle
window of ``--idle-s`` seconds measures the background work (health probes, load scrapes)
per second, reported beside, not subtracted (a round of 300 requests takes a few seconds).
The gateway runs with ``PYTHONHASHSEED=0``: with random seeds, separate processes differ by
about 2 % (the APIs' ratios, measured in one process, do not).

APIs: ``chat`` (a streamed ``/v1/chat/completions``), ``messages`` (the same prompt as a
streamed Anthropic ``/v1/messages``) and ``responses`` (as a streamed ``/v1/responses``),
the latter two translated to the chat stream and back, as in ``gateway_overhead.py``, or with
``--native-apis`` forwarded as sent and relayed as answered (the gateway's ``--native-apis
messages responses``, for engines that serve the APIs themselves, such as vLLM; nginx
answers them in kind).

    apt-get install -y nginx valgrind     # once, as root
    .venv/bin/python benchmarks/gateway_instructions.py --out /tmp/gateway_instructions.json

User-space instructions only (the kernel's socket work is not counted); the interpreter under
callgrind runs ~50x slower, so this measures cost, not latency. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent))

from _canned_upstream import start_canned_upstream
from _harness import ProcGroup, command_line, free_port, machine, wait_http
from _loadgen import request_bytes

APIS = ("chat", "messages", "responses")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--apis", default=",".join(APIS), help="comma list of chat, messages, responses")
    p.add_argument("--requests", type=int, default=300, help="measured requests per round")
    p.add_argument("--warmup", type=int, default=20, help="unmeasured requests before each")
    p.add_argument("--rounds", type=int, default=2, help="rounds over the APIs, interleaved")
    p.add_argument("--idle-s", type=float, default=10.0, help="idle window (background work)")
    p.add_argument("--prompt-words", type=int, default=128)
    p.add_argument(
        "--native-apis",
        action="store_true",
        help="the gateway forwards Messages and Responses natively, not translated",
    )
    p.add_argument("--out", default="gateway_instructions.json")
    return p.parse_args(argv)


def send(port: int, raw: bytes, n: int) -> None:
    """``n`` requests one after another on one connection, each read to its last chunk."""
    with socket.create_connection(("127.0.0.1", port)) as s:
        for _ in range(n):
            s.sendall(raw)
            buf = b""
            while not (b"\r\n\r\n" in buf and buf.endswith(b"\r\n0\r\n\r\n")):
                data = s.recv(65536)
                if not data:
                    raise RuntimeError("the gateway closed the connection")
                buf += data
            if not buf.startswith(b"HTTP/1.1 200"):
                raise RuntimeError(f"the gateway answered {buf[:40]!r}")


def totals(path: Path) -> int:
    """The instruction total of one callgrind dump."""
    m = re.search(r"^totals: (\d+)", path.read_text(encoding="utf-8", errors="replace"), re.M)
    if m is None:
        raise RuntimeError(f"no totals in {path}")
    return int(m.group(1))


def per_request(rounds: dict[str, list[int]], n: int) -> dict[str, Any]:
    """Per API: instructions per request of each round, their mean, and the mean as a
    multiple of chat's."""
    out: dict[str, Any] = {}
    chat = rounds.get("chat")
    base = sum(chat) / len(chat) / n if chat else None
    for api, counts in rounds.items():
        each = [round(c / n) for c in counts]
        mean = sum(counts) / len(counts) / n
        out[api] = {"instructions_per_request": round(mean), "rounds": each,
                    "vs_chat": round(mean / base, 3) if base else None}  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    for tool in ("nginx", "valgrind", "callgrind_control"):
        if not shutil.which(tool):
            print(f"{tool} is not installed (apt-get install -y nginx valgrind)", file=sys.stderr)
            return 1
    apis = [a.strip() for a in args.apis.split(",") if a.strip()]
    if not apis or any(a not in APIS for a in apis):
        print(f"--apis takes {', '.join(APIS)}", file=sys.stderr)
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="tideserve-instr-"))
    group = ProcGroup(workdir)
    out_prefix = workdir / "callgrind.out"
    rounds: dict[str, list[int]] = {a: [] for a in apis}
    idle = 0
    try:
        upstream = start_canned_upstream(group, workdir)
        port = free_port()
        cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no",
               f"--callgrind-out-file={out_prefix}", sys.executable, "-m", "services.cli",
               "gateway", "--host", "127.0.0.1", "--port", str(port), "--endpoints", upstream,
               "--log-level", "WARNING"]  # fmt: skip
        if args.native_apis:
            cmd += ["--native-apis", "messages", "responses"]
        # one hash seed: set and dict orders, and so the instructions, repeat across runs
        pid = group.start("gateway", cmd, env={"PYTHONHASHSEED": "0"}).proc.pid
        wait_http(f"http://127.0.0.1:{port}/v1/models", group, 900.0)
        dumps = 0

        def measured(label: str, work: Any) -> int:
            nonlocal dumps
            subprocess.run(["callgrind_control", "-z", str(pid)], capture_output=True, check=True)
            subprocess.run(["callgrind_control", "-i", "on", str(pid)], capture_output=True,
                           check=True)  # fmt: skip
            work()
            subprocess.run(["callgrind_control", "-i", "off", str(pid)], capture_output=True,
                           check=True)  # fmt: skip
            subprocess.run(["callgrind_control", "-d", label, str(pid)], capture_output=True,
                           check=True)  # fmt: skip
            dumps += 1
            return totals(Path(f"{out_prefix}.{dumps}"))

        for _ in range(args.rounds):
            for api in apis:
                raw = request_bytes("127.0.0.1", port, True, args.prompt_words, (), api)
                send(port, raw, args.warmup)
                rounds[api].append(measured(api, lambda r=raw: send(port, r, args.requests)))
        idle = measured("idle", lambda: time.sleep(args.idle_s))
    finally:
        group.stop()
    doc = {
        "benchmark": "gateway_instructions", "command": command_line(), "machine": machine(),
        "requests_per_round": args.requests, "prompt_words": args.prompt_words,
        "agent_apis_forwarding": "native" if args.native_apis else "translated",
        "apis": per_request(rounds, args.requests),
        "idle_instructions_per_s": round(idle / args.idle_s),
    }  # fmt: skip
    text = json.dumps(doc, indent=2)
    Path(args.out).write_text(text + "\n", encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
