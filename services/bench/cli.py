"""``tideserve bench``: replay a trace against OpenAI-compatible targets and report.

Exit codes: 0 the run finished (failed requests are counted in the JSON), 1 every request
failed, 2 the run could not start (bad options, bad trace line, unreachable target, missing
matplotlib for --plot); nothing is sent when the exit code is 2.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from services.bench.client import SESSIONS, BenchConfig, BenchError, run_bench
from services.common.bench.stats import markdown_table, request_records
from services.common.bench.traces import FORMATS, TraceError, load_trace

EXAMPLES = """\
examples:
  # 500 Mooncake requests, 4x faster than recorded, against the gateway
  tideserve bench --trace ../shared/traces/mooncake_conversation_trace.jsonl \\
      --target http://127.0.0.1:8000 --max-requests 500 --speedup 4 --out run.json --markdown

  # two bare engines, round-robin, SLOs, figures in trace time (engines run --speedup 10)
  tideserve bench --trace trace.jsonl --target http://127.0.0.1:30001 \\
      --target http://127.0.0.1:30002 --speedup 10 --trace-time \\
      --slo-ttft-ms 2000 --slo-tpot-ms 100

  # Azure CSV at twice the recorded rate, 60 s, at most 32 requests in flight, with a plot
  tideserve bench --trace azure2023_conv.csv --target http://127.0.0.1:8000 \\
      --rate-scale 2 --duration 60 --concurrency-limit 32 --plot run.png

Prompts are synthesised deterministically (see services/common/bench/prompts.py): equal Mooncake
hash ids give equal 512-token blocks, so the trace's prefix reuse is preserved; the engine's
chat template may add a few tokens around each prompt (use --api completions to avoid it).
Every request streams with max_tokens = min_tokens = output length and ignore_eos.
"""


def _positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not v > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return v


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return v


def _non_negative_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return v


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trace", required=True, help="Mooncake JSONL or Azure CSV trace file")
    p.add_argument("--format", choices=FORMATS, default="auto", help="trace format (default: auto)")
    p.add_argument(
        "--target",
        action="append",
        required=True,
        metavar="URL",
        help="OpenAI-compatible base URL, e.g. http://127.0.0.1:8000; repeat to round-robin",
    )
    p.add_argument("--model", help="model name (default: the first of GET /v1/models)")
    p.add_argument(
        "--api",
        choices=("chat", "completions"),
        default="chat",
        help="endpoint: /v1/chat/completions (default) or /v1/completions",
    )
    p.add_argument(
        "--speedup", type=_positive_float, default=1.0, help="time compression of the trace"
    )
    p.add_argument(
        "--rate-scale",
        type=_positive_float,
        default=1.0,
        help="multiply the request rate (2 = arrivals twice as dense)",
    )
    p.add_argument("--max-requests", type=_positive_int, help="replay the first N requests")
    p.add_argument(
        "--duration", type=_positive_float, help="stop sending after S seconds (wall clock)"
    )
    p.add_argument("--concurrency-limit", type=_positive_int, help="max requests in flight")
    p.add_argument("--slo-ttft-ms", type=_positive_float, help="TTFT SLO for goodput")
    p.add_argument("--slo-tpot-ms", type=_positive_float, help="TPOT SLO for goodput")
    p.add_argument(
        "--trace-time",
        action="store_true",
        help="report latencies, rates and SLOs in trace time (wall x speedup); use when the "
        "targets run time faster by the same --speedup (simulated engines)",
    )
    p.add_argument("--seed", type=_non_negative_int, default=0, help="prompt synthesis seed")
    p.add_argument(
        "--sessions", choices=SESSIONS, default="none",
        help="first-block: send each request's session as X-Tideserve-Session, taken as its "
        "first hash id (agentic traces: a session's turns all start with its first block), "
        "so the gateway tracks agent sessions (default none)",
    )  # fmt: skip
    p.add_argument(
        "--model-path",
        metavar="DIR",
        help="served model's directory (tokenizer.json): build prompts of its single-token "
        "words, so a trace block is block-size model tokens (default: whitespace words)",
    )
    p.add_argument("--timeout", type=_positive_float, default=600.0, help="per-request timeout (s)")
    p.add_argument("--out", metavar="FILE.json", help="write the summary JSON here")
    p.add_argument(
        "--requests-out", metavar="FILE.jsonl",
        help="write one JSON line per request (its index in the trace, target, TTFT, TPOT, "
        "E2E, tokens, cached tokens, whether it met the SLOs, error), in the summary's units",
    )  # fmt: skip
    p.add_argument("--markdown", action="store_true", help="print a Markdown table on stdout")
    p.add_argument("--plot", metavar="FILE.png", help="latency CDF + timeline (needs [plot])")


def register(subparsers: Any) -> None:
    """Add the ``bench`` subcommand to a ``tideserve`` argparse subparsers object."""
    p = subparsers.add_parser(
        "bench",
        help="replay a trace against OpenAI-compatible targets",
        description="Replay a Mooncake/Azure trace against OpenAI-compatible targets, "
        "stream every request and report TTFT, TPOT, E2E, throughput, cache hits, goodput.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Execute ``tideserve bench`` with parsed arguments; returns the exit code."""
    try:
        if args.plot:
            from services.common.bench.plot import PlotUnavailable, ensure_available

            try:
                ensure_available()
            except PlotUnavailable as exc:
                raise BenchError(str(exc)) from None
        trace = load_trace(args.trace, args.format)
        cfg = BenchConfig(
            targets=tuple(args.target),
            model=args.model,
            api=args.api,
            speedup=args.speedup,
            rate_scale=args.rate_scale,
            max_requests=args.max_requests,
            duration_s=args.duration,
            concurrency_limit=args.concurrency_limit,
            timeout_s=args.timeout,
            seed=args.seed,
            slo_ttft_ms=args.slo_ttft_ms,
            slo_tpot_ms=args.slo_tpot_ms,
            trace_time=args.trace_time,
            model_path=args.model_path,
            sessions=args.sessions,
        )
        summary, results = asyncio.run(run_bench(cfg, trace))
    except (TraceError, BenchError) as exc:
        print(f"tideserve bench: error: {exc}", file=sys.stderr)
        return 2
    text = json.dumps(summary, indent=2)
    if args.out:
        Path(args.out).write_text(text + "\n", encoding="utf-8")
    if args.requests_out:
        records = request_records(
            results,
            slo_ttft_ms=cfg.slo_ttft_ms,
            slo_tpot_ms=cfg.slo_tpot_ms,
            time_scale=cfg.time_scale,
        )
        Path(args.requests_out).write_text(
            "".join(json.dumps(rec) + "\n" for rec in records), encoding="utf-8"
        )
    if args.markdown:
        sys.stdout.write(markdown_table(summary))
    else:
        print(text)
    if args.plot:
        from services.common.bench.plot import write_plot

        write_plot(args.plot, results, cfg.time_scale)
    cpu = summary.get("cpu") or {}
    if cpu.get("saturated"):
        print(
            "tideserve bench: WARNING: the machine's CPU was saturated during the run "
            f"(mean {cpu.get('mean_total_percent')}%, busiest window "
            f"{cpu.get('longest_busy_window_s')}s): latencies include CPU queueing, the "
            "figures are not clean",
            file=sys.stderr,
        )
    if summary["failed"]:
        print(
            f"tideserve bench: {summary['failed']} request(s) failed: {summary['errors']}",
            file=sys.stderr,
        )
    return 1 if summary["completed"] == 0 and summary["failed"] else 0


def main(argv: list[str] | None = None) -> int:
    """Standalone entry point (``python -m services.bench ...``)."""
    parser = argparse.ArgumentParser(
        prog="tideserve bench",
        description="Replay a trace against OpenAI-compatible targets.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    args = parser.parse_args(argv)
    return run(args)
