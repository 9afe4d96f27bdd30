"""Accuracy of telemetry's fitted performance model against the engine simulator.

One fleet of simulated engines (``tideserve engine``, load snapshots to an embedded Redis)
behind one Tideserve gateway writing a ``RequestRecord`` per request to
``{prefix}:requests``. For each slice (trace offset, request count, rate scale) the script
replays that slice of the trace with ``tideserve bench``, reads the slice's records back
from the stream, fits the model core (:mod:`services.telemetry.model`: the same
``ModelState`` sample extraction and ``fit_role`` the service runs, starting from the
``--prior`` profile) on the first ``--train`` fraction of the records by arrival, and
predicts the TTFT of the rest: ``queue_ms + prefill_ms(uncached, queued ahead)`` with the
fitted coefficients (the ``PerfModel`` contract's formula). Reported per slice and as mean
and spread over the slices: the median absolute relative TTFT error (target < 10%), the
same for the prior alone, for the engines' true profile given the same features (a
reference: what these features can explain), and the decode (TPOT) error. Engines run at ``--speedup 1`` so
the gateway's wall-clock timings are the simulator's modelled time.

    .venv/bin/python benchmarks/perfmodel_fit.py --engines 4 \\
        --slices 0:250:1.5,3000:250:2.5,6000:250:3.5 --out /tmp/perfmodel_fit.json
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np
from _harness import (
    MOONCAKE_CONVERSATION,
    ROOT,
    CpuMeter,
    ProcGroup,
    command_line,
    free_port,
    machine,
    read_records,
    tideserve,
    wait_http,
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--engines", type=int, default=4)
    p.add_argument("--profile", default="h200-llama3.1-8b", help="the engines' true profile")
    p.add_argument(
        "--prior", default="h200-llama3.1-8b*2",
        help="the fit's prior (default: a device twice as slow, so the fit must move off it)",
    )  # fmt: skip
    p.add_argument("--trace", default=str(MOONCAKE_CONVERSATION))
    p.add_argument(
        "--slices", default="0:250:1.5,3000:250:2.5,6000:250:3.5",
        help="comma list of OFFSET:COUNT:RATE_SCALE (trace lines, requests, arrival compression)",
    )  # fmt: skip
    p.add_argument("--train", type=float, default=0.6, help="fraction of a slice to fit on")
    p.add_argument("--kv-blocks", type=int, default=16384)
    p.add_argument("--stream-interval", type=int, default=16)
    p.add_argument("--out", default="perfmodel_fit.json")
    p.add_argument("--log-dir", default=None)
    return p.parse_args(argv)


def write_slice(trace: Path, offset: int, count: int, dest: Path) -> Path:
    lines = [ln for ln in trace.read_text(encoding="utf-8").splitlines() if ln.strip()]
    dest.write_text("\n".join(lines[offset : offset + count]) + "\n", encoding="utf-8")
    return dest


def _median_err(pred: list[float], actual: list[float]) -> float | None:
    if not pred:
        return None
    a = np.asarray(actual)
    return float(np.median(np.abs(np.asarray(pred) - a) / np.maximum(a, 1e-3)))


def evaluate(records: list[Any], args: argparse.Namespace) -> dict[str, Any]:
    """Fit on the first ``train`` of ``records`` (by arrival), predict the rest."""
    from tideserve.v1 import common_pb2, events_pb2

    from services.common.perfcoef import prior_coefficients
    from services.common.perfmodel import get_profile
    from services.telemetry.model.fit import FitConfig, fit_role
    from services.telemetry.model.state import ModelState

    ok = [r for r in records if r.outcome == events_pb2.REQUEST_OUTCOME_OK and r.ttft_ms > 0]
    ok.sort(key=lambda r: r.arrival_ms)
    cut = int(len(ok) * args.train)
    train, test = ok[:cut], ok[cut:]
    prior_profile = get_profile(args.prior)
    prior = prior_coefficients(prior_profile)
    cfg = FitConfig()
    state = ModelState(cfg, prior_profile.kv_bytes_per_token, 64)
    state.observe_records(train)
    key = ("default", common_pb2.ROLE_WORKER)
    fit = fit_role(state.samples[key], prior, cfg, int(time.time() * 1000))
    c = fit.coefficients

    def ttft(coef: Any, r: Any) -> float:
        n = max(0, r.prompt_tokens - r.cached_tokens)
        return r.queue_ms + coef.prefill_ms(n, r.engine_pending_prefill_tokens)

    def tpot(coef: Any, r: Any) -> float:
        b = r.engine_running + 1
        return float(coef.decode_step_ms(b, b * (r.prompt_tokens + r.completion_tokens / 2)))

    true_profile = get_profile(args.profile)
    true_tps = true_profile.prefill_tokens_per_s()

    def oracle(r: Any) -> float:
        """The engines' own roofline with the same features: what the records let a model
        explain at best (the rest is timing the features do not carry)."""
        n = max(0, r.prompt_tokens - r.cached_tokens)
        wait = 1000.0 * r.engine_pending_prefill_tokens / true_tps
        return float(r.queue_ms + wait + true_profile.prefill_ms(n, r.cached_tokens))

    dec = [r for r in test if r.completion_tokens >= 2 and r.tpot_ms > 0]
    actual = [r.ttft_ms for r in test]
    return {
        "records": len(records),
        "ok": len(ok),
        "train": len(train),
        "test": len(test),
        "ttft_error": _median_err([ttft(c, r) for r in test], actual),
        "ttft_error_prior": _median_err([ttft(prior, r) for r in test], actual),
        "ttft_error_true_profile": _median_err([oracle(r) for r in test], actual),
        "tpot_error": _median_err([tpot(c, r) for r in dec], [r.tpot_ms for r in dec]),
        "tpot_error_prior": _median_err([tpot(prior, r) for r in dec], [r.tpot_ms for r in dec]),
        "test_ttft_ms_median": float(np.median(actual)) if actual else None,
        "test_queued_tokens_median": float(
            np.median([r.engine_pending_prefill_tokens for r in test])
        )
        if test
        else None,
        "fit": {
            "prefill_base_ms": c.prefill_base_ms,
            "prefill_ms_per_token": c.prefill_ms_per_token,
            "prefill_ms_per_token2": c.prefill_ms_per_token2,
            "decode_base_ms": c.decode_base_ms,
            "decode_ms_per_seq": c.decode_ms_per_seq,
            "decode_ms_per_ktoken": c.decode_ms_per_ktoken,
            "prefill_samples": fit.prefill.samples,
            "prefill_confidence": round(fit.prefill.confidence, 3),
            "prefill_heldout_error": round(fit.prefill.error, 4),
            "decode_confidence": round(fit.decode.confidence, 3),
        },
        "true_profile_prefill_ms": {
            str(n): round(get_profile(args.profile).prefill_ms(n), 2) for n in (512, 4096, 8192)
        },
        "fitted_prefill_ms": {str(n): round(c.prefill_ms(n), 2) for n in (512, 4096, 8192)},
    }


def _spread(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"mean": None, "stdev": None, "min": None, "max": None}
    return {
        "mean": round(statistics.fmean(values), 4),
        "stdev": round(statistics.pstdev(values), 4),
        "min": round(min(values), 4),
        "max": round(max(values), 4),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from google.protobuf import json_format

    from services.common.embedded import start_redis

    log_dir = Path(args.log_dir or tempfile.mkdtemp(prefix="tideserve-perfmodel-fit-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    slices = []
    for item in args.slices.split(","):
        off, cnt, rate = item.split(":")
        slices.append((int(off), int(cnt), float(rate)))
    redis_server = start_redis(log_dir / "redis", 0)
    group = ProcGroup(log_dir)
    prefix = "fit"
    streams = ["--redis-url", redis_server.url, "--stream-prefix", prefix]
    results: list[dict[str, Any]] = []
    try:
        urls = []
        for i in range(args.engines):
            port = free_port()
            urls.append(f"http://127.0.0.1:{port}")
            group.start(f"engine-{i}", tideserve(
                "engine", "--port", str(port), "--instance-id", f"fit-{i}",
                "--profile", args.profile, "--kv-blocks", str(args.kv_blocks),
                "--speedup", "1", "--stream-interval", str(args.stream_interval),
                "--state-dir", str(log_dir / f"engine-{i}"), "--log-level", "WARNING", *streams,
            ))  # fmt: skip
        for u in urls:
            wait_http(u + "/health", group, 90.0)
        gport = free_port()
        gateway = f"http://127.0.0.1:{gport}"
        group.start("gateway", tideserve(
            "gateway", "--host", "127.0.0.1", "--port", str(gport), "--endpoints", *urls,
            "--perf-profile", args.profile, *streams,
        ))  # fmt: skip
        wait_http(gateway + "/v1/models", group, 90.0)
        time.sleep(2.0)  # one health/load round
        last = "-"
        for off, cnt, rate in slices:
            trace = write_slice(Path(args.trace), off, cnt, log_dir / f"slice-{off}.jsonl")
            out = log_dir / f"bench-{off}.json"
            bench = tideserve(
                "bench", "--trace", str(trace), "--target", gateway, "--api", "chat",
                "--max-requests", str(cnt), "--speedup", "1", "--rate-scale", str(rate),
                "--trace-time", "--timeout", "600", "--out", str(out),
            )  # fmt: skip
            print(f"[slice {off}:{cnt}:{rate}] {shlex.join(bench)}", file=sys.stderr)
            cpu = CpuMeter(group.pids())
            started = time.monotonic()
            with (log_dir / f"bench-{off}.log").open("wb") as blog:
                subprocess.run(bench, cwd=ROOT, stdout=blog, stderr=subprocess.STDOUT, check=False)
            time.sleep(1.5)  # the gateway's record sink flushes
            records, last = read_records(redis_server.url, f"{prefix}:requests", last)
            dump = log_dir / f"records-{off}.jsonl"
            dump.write_text("".join(json_format.MessageToJson(r, indent=None) + "\n"
                                    for r in records))  # fmt: skip
            summary = json.loads(out.read_text()) if out.exists() else {}
            res = {
                "slice": {"offset": off, "requests": cnt, "rate_scale": rate},
                "wall_s": round(time.monotonic() - started, 1),
                "fleet_cpu": cpu.read(),
                "bench_cpu_saturated": summary.get("cpu", {}).get("saturated"),
                "bench_ttft_ms": summary.get("ttft_ms"),
                **evaluate(records, args),
            }
            results.append(res)
            print(f"[slice {off}] ttft_error {res['ttft_error']} (prior {res['ttft_error_prior']})",
                  file=sys.stderr)  # fmt: skip
    finally:
        group.stop()
        redis_server.stop()
    errs = [r["ttft_error"] for r in results if r["ttft_error"] is not None]
    summary_out = {
        "benchmark": "perfmodel_fit",
        "command": command_line(),
        "engines": args.engines,
        "profile": args.profile,
        "prior": args.prior,
        "train_fraction": args.train,
        "machine": machine(),
        "slices": results,
        "ttft_error": _spread(errs),
        "ttft_error_prior": _spread(
            [r["ttft_error_prior"] for r in results if r["ttft_error_prior"] is not None]
        ),
        "ttft_error_true_profile": _spread(
            [
                r["ttft_error_true_profile"]
                for r in results
                if r["ttft_error_true_profile"] is not None
            ]
        ),
        "tpot_error": _spread([r["tpot_error"] for r in results if r["tpot_error"] is not None]),
        "load_average_after": list(os.getloadavg()),
        "target": "median absolute relative TTFT error < 0.10 (mean over slices)",
        "met": bool(errs) and statistics.fmean(errs) < 0.10,
        "log_dir": str(log_dir),
    }
    text = json.dumps(summary_out, indent=2)
    Path(args.out).write_text(text + "\n", encoding="utf-8")
    print(text)
    return 0 if results else 1


if __name__ == "__main__":
    sys.exit(main())
