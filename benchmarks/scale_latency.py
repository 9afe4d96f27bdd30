"""Time from a scaling decision to the new instance serving, and from a scale-in decision to
the victim gone (drained, then stopped), with the local driver and the reconciler.

Everything real and in one place: the scheduler service (gRPC + OpenAI HTTP gateway)
following ``{prefix}:membership`` on Redis (embedded unless ``--redis-url``), the
:class:`~services.autoscaler.reconciler.Reconciler` over the local driver starting simulated
engine processes (``tideserve engine --profile test``), and closed-loop clients keeping
streamed requests in flight through the gateway the whole time.

Each round: ``apply`` ``base`` -> ``base + step`` replicas (the *decision*, t0), then poll the
gateway's ``ListEndpoints`` every 20 ms; an instance is *serving* once the gateway lists it
healthy and not draining (it gets new requests from then on). Per instance we report
decision -> serving, and the engine's own start -> ready (``startup_ms``, the driver's
measurement the planner uses as lead time). Then ``apply`` back to ``base`` (scale-in while
requests are in flight): decision -> every victim stopped, which includes the drain.
Requests lost (non-200, cut streams) are counted over the whole run.

    .venv/bin/python benchmarks/scale_latency.py --rounds 5 --step 2
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _harness import command_line, emit_json, machine

from services.common.embedded import start_redis
from tests.helpers.autoscale import ClosedLoop, Rig, autoscaled_gateway


def _summary(xs: list[float]) -> dict[str, float]:
    if not xs:
        return {}
    xs = sorted(xs)
    return {
        "n": len(xs),
        "p50_s": round(statistics.median(xs), 3),
        "max_s": round(xs[-1], 3),
        "mean_s": round(statistics.fmean(xs), 3),
    }


async def _wait_serving(rig: Rig, n: int, t0: float, timeout_s: float) -> dict[str, float]:
    """Poll until ``n`` instances serve; seconds from ``t0`` at which each was first seen."""
    seen: dict[str, float] = {}
    while len(seen) < n or len(await rig.serving()) != n:
        now = await rig.serving()
        t = time.monotonic() - t0
        for iid in now:
            seen.setdefault(iid, t)
        if t > timeout_s:
            raise TimeoutError(f"{len(now)} of {n} serving after {timeout_s:g}s")
        await asyncio.sleep(0.02)
    return seen


async def _wait_gone(rig: Rig, n: int, t0: float, timeout_s: float) -> float:
    while len(rig.reconciler.instances(rig.deployment)) != n:
        if time.monotonic() - t0 > timeout_s:
            raise TimeoutError(f"scale-in to {n} not done after {timeout_s:g}s")
        await asyncio.sleep(0.02)
    return time.monotonic() - t0


async def run(args: argparse.Namespace, redis_url: str, state: Path) -> dict[str, Any]:
    to_serving: list[float] = []
    startup: list[float] = []
    to_gone: list[float] = []
    drains: list[dict[str, Any]] = []
    async with autoscaled_gateway(redis_url, state) as rig:
        rig.reconciler.apply(rig.target(args.base, "bench: base"))
        before = await _wait_serving(rig, args.base, time.monotonic(), args.timeout)
        load = ClosedLoop(rig.gateway, clients=args.clients, max_tokens=args.max_tokens)
        load.start()
        for k in range(args.rounds):
            t0 = time.monotonic()
            rig.reconciler.apply(rig.target(args.base + args.step, f"bench: round {k} out"))
            seen = await _wait_serving(rig, args.base + args.step, t0, args.timeout)
            new = set(seen) - set(before)
            to_serving += [seen[i] for i in new]
            startup += [
                i.startup_ms / 1000
                for i in rig.reconciler.instances(rig.deployment)
                if i.instance_id in new
            ]
            t0 = time.monotonic()
            rig.reconciler.apply(rig.target(args.base, f"bench: round {k} in"))
            to_gone.append(await _wait_gone(rig, args.base, t0, args.timeout))
            before = await _wait_serving(rig, args.base, time.monotonic(), args.timeout)
        await load.stop()
        drains = [
            {"drained": r.drained, "waited_s": round(r.waited_s, 3), "polls": r.polls}
            for _, r in rig.drainer.results
        ]
    return {
        "decision_to_serving": _summary(to_serving),
        "engine_start_to_ready": _summary(startup),
        "scale_in_decision_to_stopped": _summary(to_gone),
        "drains": {
            "n": len(drains),
            "all_drained": all(d["drained"] for d in drains),
            "with_requests_in_flight_at_start": sum(d["polls"] > 1 for d in drains),
            "max_wait_s": max((d["waited_s"] for d in drains), default=0.0),
        },
        "requests": {"sent": load.sent, "answered": len(load.outcomes),
                     "lost": len(load.failures()) + load.sent - len(load.outcomes)},
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5, help="scale-out/in rounds")
    ap.add_argument("--base", type=int, default=1, help="replicas between rounds")
    ap.add_argument("--step", type=int, default=2, help="replicas added per round")
    ap.add_argument("--clients", type=int, default=6, help="closed-loop clients")
    ap.add_argument("--max-tokens", type=int, default=96, help="tokens per request")
    ap.add_argument("--timeout", type=float, default=120.0, help="per wait, seconds")
    ap.add_argument("--redis-url", default=None, help="default: an embedded redis-server")
    ap.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ts-scale-") as tmp:
        state = Path(tmp)
        redis = None if args.redis_url else start_redis(state / "redis", 0)
        try:
            url = args.redis_url or (redis.url if redis else "")
            figures = asyncio.run(run(args, url, state))
        finally:
            if redis is not None:
                redis.stop()
    out = {
        "benchmark": "scale_latency",
        "command": command_line(),
        "machine": machine(),
        "params": {k: v for k, v in vars(args).items() if k not in ("out", "redis_url")},
        **figures,
        "target_decision_to_serving_s": 10.0,
    }
    emit_json(out, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
