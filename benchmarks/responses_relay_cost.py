"""The gateway's own per-request work for the Responses API against chat's, in-process.

Per API and stage, the work the gateway does beside what every request costs (HTTP, routing,
admission, the record):

| stage | chat (the reference) | Responses |
|---|---|---|
| ``parse`` | ``parse_request`` of the chat body | the Responses body parsed, translated to the canonical chat body, ``parse_request`` of it, and (native) the engine's body built and encoded |
| ``stream`` | the request record reads the chat stream | the record reads the engine's stream, the Turn writes the client's events and its last event (native: the engine's Responses stream relayed; translated: the chat stream translated) |

The streams and bodies are ``gateway_overhead.py``'s (a 128-word prompt, 8 tokens, nothing
stored; ``--tokens`` streams more). The stream is fed whole, or with ``--per-event`` one
event a read, as an engine streaming token by token reaches the gateway. Messages
(translated) is measured beside: ``parse_request`` of the Messages body, and its stream
translated. Each stage runs ``--requests`` times per round; the figure is the CPU time per
request (``time.process_time``), the minimum over ``--rounds`` rounds (the machine's other
work only adds to it). With ``--instructions`` the script runs itself under Valgrind's
callgrind and gives instructions per request instead, which a busy machine does not move
(one round; ``apt-get install -y valgrind``).

    .venv/bin/python benchmarks/responses_relay_cost.py --out /tmp/responses_relay_cost.json

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _canned_upstream import chat_stream as canned_chat_stream
from _canned_upstream import native_streams
from _harness import command_line, emit_json, machine
from _loadgen import request_bytes

from services.common import jsonfast
from services.scheduler.core.records import RequestContext
from services.scheduler.http.messages import messages_answer
from services.scheduler.http.openai import parse_request
from services.scheduler.http.responses import ResponsesApi

CHUNKS = 8


def chat_stream(tokens: int = CHUNKS) -> bytes:
    """The canned upstream's chat stream (one token a chunk, usage on the last chunk)."""
    return canned_chat_stream(tokens)


def _reads(stream: bytes, per_event: bool) -> list[bytes]:
    """The stream as the gateway reads it: whole, or one SSE event a read."""
    if not per_event:
        return [stream]
    return [e + b"\n\n" for e in stream.split(b"\n\n") if e]


def _ctx() -> RequestContext:
    return RequestContext(request_id="r", trace_id="t", arrival=0.0, arrival_wall=0.0)


def _run(coro: Any) -> Any:
    """A coroutine that never suspends (no store), run without an event loop."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value
    raise RuntimeError("the coroutine suspended")


def _body(api: str) -> bytes:
    raw = request_bytes("127.0.0.1", 1, True, 128, (), api)
    return raw.partition(b"\r\n\r\n")[2]


Stage = tuple[Callable[[], Any], Callable[[Any], object]]
"""A stage: its setup (not measured) and its work on what the setup made."""


def stages(tokens: int = CHUNKS, per_event: bool = False) -> dict[str, Stage]:
    """The measured work of one request, by ``api/stage``."""
    chat_raw, resp_raw, msg_raw = _body("chat"), _body("responses"), _body("messages")
    chat_sse = chat_stream(tokens)
    native_sse = native_streams(chat_sse, tokens)["responses"].encode()
    chat_reads, native_reads = _reads(chat_sse, per_event), _reads(native_sse, per_event)
    apis = {"native": ResponsesApi(native=True), "translated": ResponsesApi(native=False)}

    def parse(kind: Any, raw: bytes, canonical: Any = None) -> Any:
        return parse_request(kind, raw, {}, models=(), classes=("agent",), canonical=canonical)

    def turn(mode: str) -> Any:
        api = apis[mode]
        parsed, turn = _run(api.parse(_ctx(), resp_raw, lambda c: parse("responses", resp_raw, c),
                                      1 << 26))  # fmt: skip
        return parsed, turn

    def admitted(made: Any) -> object:
        parsed, turn = made
        parsed = turn.admitted(parsed)
        return parsed.raw_body or jsonfast.dumps(parsed.forward_body)  # as upstream.py does

    def relayed(upstream: list[bytes]) -> Callable[[Any], object]:
        def work(made: Any) -> object:
            _parsed, turn = made
            out = []
            for read in upstream:  # as relay.py does
                turn.ctx.chunk(read)
                out.append(turn.feed(read))
            out.append(_run(turn.end()))
            turn.ctx.answer()
            return out

        return work

    def chat_relayed(ctx: RequestContext) -> object:
        for read in chat_reads:
            ctx.chunk(read)
        return ctx.answer()

    def messages_ready() -> Any:
        ctx = streaming()
        return ctx, messages_answer(parse("messages", msg_raw), False, ctx)

    def messages_relayed(made: Any) -> object:
        ctx, answer = made
        out = []
        for read in chat_reads:
            ctx.chunk(read)
            out.append(answer.feed(read))
        out.append(_run(answer.end()))
        ctx.answer()
        return out

    def streaming() -> RequestContext:
        ctx = _ctx()
        ctx.answering(0.0, True)  # as the relay does before the first chunk
        return ctx

    def none() -> None:
        return None

    def ready(mode: str) -> Callable[[], Any]:
        def setup() -> Any:
            parsed, t = turn(mode)
            t.ctx.answering(0.0, True)
            return t.admitted(parsed), t

        return setup

    return {
        "chat/parse": (none, lambda _: parse("chat", chat_raw)),
        "responses_native/parse": (none, lambda _: admitted(turn("native"))),
        "responses_translated/parse": (none, lambda _: admitted(turn("translated"))),
        "chat/stream": (streaming, chat_relayed),
        "responses_native/stream": (ready("native"), relayed(native_reads)),
        "responses_translated/stream": (ready("translated"), relayed(chat_reads)),
        "messages_translated/parse": (none, lambda _: parse("messages", msg_raw)),
        "messages_translated/stream": (messages_ready, messages_relayed),
    }


def _callgrind(*args: str) -> None:
    subprocess.run(["callgrind_control", *args, str(os.getpid())], capture_output=True, check=True)


def measure(name: str, stage: Stage, n: int, prefix: str | None) -> float:
    """Per request: CPU seconds, or instructions when run under callgrind (``prefix``: its
    dump files)."""
    setup, work = stage
    made = [setup() for _ in range(n)]
    if prefix is None:
        start = time.process_time()
        for m in made:
            work(m)
        return (time.process_time() - start) / n
    before = set(Path(prefix).parent.glob(Path(prefix).name + ".*"))
    _callgrind("-z")
    _callgrind("-i", "on")
    for m in made:
        work(m)
    _callgrind("-i", "off")
    _callgrind("-d", name)
    (path,) = set(Path(prefix).parent.glob(Path(prefix).name + ".*")) - before
    m = re.search(r"^totals: (\d+)", path.read_text(errors="replace"), re.M)
    if m is None:
        raise RuntimeError(f"no totals in {path}")
    return int(m.group(1)) / n


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--requests", type=int, default=2000, help="requests per stage and round")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--instructions", action="store_true", help="count instructions (callgrind)")
    p.add_argument("--tokens", type=int, default=CHUNKS, help="tokens (chunks) per stream")
    p.add_argument("--per-event", action="store_true", help="feed the stream one event a read")
    p.add_argument("--callgrind-out", default="", help=argparse.SUPPRESS)
    p.add_argument("--out", default="responses_relay_cost.json")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.instructions and not args.callgrind_out:
        out = Path(tempfile.mkdtemp(prefix="tideserve-relay-")) / "callgrind.out"
        cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no",
               f"--callgrind-out-file={out}", sys.executable, *sys.argv,
               "--callgrind-out", str(out)]  # fmt: skip
        return subprocess.run(cmd, env={**os.environ, "PYTHONHASHSEED": "0"}).returncode
    prefix = args.callgrind_out or None
    rounds = 1 if prefix else args.rounds
    work = stages(args.tokens, args.per_event)
    figures: dict[str, list[float]] = {name: [] for name in work}
    for _ in range(rounds):
        for name, stage in work.items():
            each = measure(name, stage, args.requests, prefix)
            figures[name].append(round(each) if prefix else round(each * 1e6, 2))
    unit = "instructions_per_request" if prefix else "cpu_us_per_request"
    best = {name: min(v) for name, v in figures.items()}
    doc: dict[str, Any] = {"benchmark": "responses_relay_cost", "command": command_line(),
                           "machine": machine(), "requests": args.requests, "unit": unit,
                           "tokens": args.tokens, "per_event": args.per_event,
                           "stages": {}}  # fmt: skip
    for name, v in figures.items():
        stage = name.split("/")[1]
        ref = best[f"chat/{stage}"]
        doc["stages"][name] = {"min": best[name], "rounds": v,
                               "minus_chat": round(best[name] - ref, 2)}  # fmt: skip
    emit_json(doc, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
