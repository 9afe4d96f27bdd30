"""The P/D measurement of ``agent_memory.py``: on agentic sessions, the aggregated fleet of N
engines against every prefill + decode split of the same N, each with the variant's agent
memory (:mod:`services.sim.memory`; on P/D its plan applies to the prefill and the decode
engines), P/D with ``decode_keeps_kv`` (decode engines cache the KV they receive).

Decode engines that cannot compute a prompt (SGLang's in disaggregation mode: every turn
is disaggregated) give the ``pd.*`` keys; decode engines that can (vLLM's, Dynamo's
workers: the routing profile's ``pd-decider`` leaves a turn whose uncached suffix is short
on its decode engine) give the same keys under ``pd_local.*``.

Per variant and slice: ``pd.best_split_ttft_vs_aggregated`` (the lowest mean TTFT of the
splits over the aggregated fleet's), ``pd.best_split_prefill`` (the winning split's prefill
engines), the two means, and per split its mean TTFT (``pd.ttft_mean_ms.<P>p<D>d``). Mean
TTFT: over the requests that got a first token without error (the failed ones, prompts past
the context limit, are the same in every fleet; ``pd.failed_max`` counts the most in any).
"""

from __future__ import annotations

import sys
import time
from dataclasses import replace

from services.common.bench.traces import Trace
from services.sim.config import SimConfig
from services.sim.run import Simulation

__all__ = ["measure"]


def _mean_ttft(cfg: SimConfig, trace: Trace) -> tuple[float | None, int]:
    """(mean TTFT ms of the served requests, failed requests) of one run."""
    t0 = time.monotonic()
    run = Simulation(cfg, trace).run()
    fleet = f"{cfg.prefill}P+{cfg.decode}D" if cfg.pd else f"{cfg.engines} aggregated"
    if cfg.pd and cfg.decode_can_prefill:
        fleet += " (decode can prefill)"
    print(f"pd {cfg.agent_memory} {fleet}: {len(run.requests)} requests, "
          f"{time.monotonic() - t0:.1f} s", file=sys.stderr)  # fmt: skip
    ttft = [r.first - r.arrival for r in run.requests if r.first is not None and r.error is None]
    failed = sum(1 for r in run.requests if r.error is not None or r.first is None)
    return (sum(ttft) / len(ttft) if ttft else None), failed


def measure(
    cfg: SimConfig, trace: Trace, engines: int, splits: list[int], local: bool = False
) -> dict[str, float | None]:
    """``cfg`` (an agent-memory mode) on ``engines`` aggregated engines and on each split
    (``splits``: prefill engines, the rest decode): the ``pd.*`` figures, or with ``local``
    (decode engines that can compute prompts) the ``pd_local.*`` ones."""
    agg, failed = _mean_ttft(replace(cfg, engines=engines, prefill=0, decode=0), trace)
    k = "pd_local" if local else "pd"
    out: dict[str, float | None] = {f"{k}.aggregated_ttft_mean_ms": agg}
    best: tuple[float, int] | None = None
    for p in splits:
        pd = replace(
            cfg, prefill=p, decode=engines - p, decode_keeps_kv=True, decode_can_prefill=local
        )
        mean, f = _mean_ttft(pd, trace)
        failed = max(failed, f)
        out[f"{k}.ttft_mean_ms.{p}p{engines - p}d"] = mean
        if mean is not None and (best is None or mean < best[0]):
            best = (mean, p)
    out[f"{k}.best_split_ttft_mean_ms"] = best[0] if best else None
    out[f"{k}.best_split_prefill"] = float(best[1]) if best else None
    out[f"{k}.best_split_ttft_vs_aggregated"] = best[0] / agg if best and agg else None
    out[f"{k}.failed_max"] = float(failed)
    return out
