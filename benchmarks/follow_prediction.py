"""How true the router's predicted TTFT is for turns behind an unfinished prefix, with and
without the dispatch order's follower rule (``dispatch_follow_ms``), in virtual time.

One cell of ``goodput_sim.py`` (same rules: its defaults), the ``default`` profile, run with
the rule off (``default+nofollow``) and on (``default``, as shipped). Per run: the mean TTFT prediction error (the pick's predicted TTFT minus
the served one), and the requests whose pick predicted at least ``--blocks`` blocks more
cached than the engine found, with their mean predicted and served TTFT.

    .venv/bin/python benchmarks/follow_prediction.py --offset 1722 --rate 1   # ~30 s
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for p in (ROOT, ROOT / "benchmarks"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import goodput_sim  # noqa: E402
from _harness import emit_json  # noqa: E402

from services.common.admission.shaper_config import DISPATCH_FOLLOW_MS  # noqa: E402
from services.common.bench.traces import load_trace  # noqa: E402
from services.sim import SimConfig, simulate  # noqa: E402


def figures(cfg: SimConfig, blocks: int, trace: Any) -> dict[str, Any]:
    _, run = simulate(cfg, trace)
    errors: list[float] = []
    short: list[tuple[float, float]] = []
    for r in run.requests:
        if r.pick is None or r.first is None:
            continue
        served = r.first - r.arrival
        errors.append(r.pick.predicted_ttft_ms - served)
        if r.pick.predicted_cached_tokens - r.cached >= blocks * cfg.block_size:
            short.append((r.pick.predicted_ttft_ms, served))
    n = len(short)
    return {
        "served": len(errors),
        "ttft_error_mean_s": round(sum(errors) / max(1, len(errors)) / 1000.0, 2),
        "cache_over_predicted": n,
        "their_predicted_ttft_s": round(sum(s[0] for s in short) / n / 1000.0, 1) if n else None,
        "their_served_ttft_s": round(sum(s[1] for s in short) / n / 1000.0, 1) if n else None,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--offset", type=int, default=1722, help="agentic slice offset")
    p.add_argument("--rate", type=float, default=1.0, help="rate scale")
    p.add_argument("--follow-ms", type=float, default=DISPATCH_FOLLOW_MS)
    p.add_argument("--blocks", type=int, default=8, help="over-predicted cache threshold")
    p.add_argument("--out", default=None)
    ours = p.parse_args(argv)
    a = goodput_sim.parse_args([])
    trace = load_trace(a.agentic_trace)
    out: dict[str, Any] = {"tool": "follow_prediction (virtual time)", "args": vars(ours)}
    with tempfile.TemporaryDirectory(prefix="follow-") as tmp:
        pfile = goodput_sim.profiles_file(a, Path(tmp))
        for name, follow in (("default+nofollow", 0.0), ("default", ours.follow_ms)):
            cfg = SimConfig(
                engines=a.engines, profile="default", profiles_file=pfile,
                engine_profile=f"{a.engine_profile}*{a.engine_slowdown:g}",
                gateway_perf_profile=a.engine_profile, rate_scale=ours.rate,
                max_requests=a.agentic_requests, offset=ours.offset, kv_blocks=a.kv_blocks,
                stream_interval=a.stream_interval, slo_ttft_ms=a.slo_ttft_ms,
                slo_tpot_ms=a.slo_tpot_ms, keep_block_hashes=True, shaper_follow_ms=follow,
            )  # fmt: skip
            out[name] = figures(cfg, ours.blocks, trace)
    emit_json(out, ours.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
