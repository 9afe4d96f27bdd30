"""Replicas a role needs for a demand at the SLO targets (pure; fractional, ceil'd later).

Rules:

* **Prefill** (and the prefill share of an aggregated worker). A replica prefills a mean
  request's uncached tokens ``n = input * (1 - hit)`` in ``s = prefill_ms(n)``; the offered
  load is ``a = rate * s`` busy replicas. Replicas behind a load-aware router queue much
  like one M/M/c queue, whose waiting time exceeds ``w`` with probability
  ``ErlangC(c, a) * exp(-(c - a) * w / s)``. Need = the fewest ``c`` (at least
  ``a / max_utilization``) for which that is at most ``1 - p/100`` with ``w = target - s``:
  TTFT meets its target at the p-th percentile. A queue backlog adds what drains it within
  the target, or within the lead time when that is longer (replicas asked for now serve only
  then): ``backlog * s / max(target, lead)``.
* **Decode** (and the decode share of a worker). Little's law: concurrency =
  ``rate * output * step`` (the time per token). A replica holds the largest batch ``b``
  whose step ``decode_step_ms(b, b * ctx)`` fits in ``target * decode_headroom`` (``ctx`` =
  input + output / 2, the mean context while decoding), and whose KV fits its memory:
  ``b * ctx <= kv_capacity_tokens`` (when the model knows it; 0 = unknown). Long agent
  contexts are KV-bound long before they are step-bound: a 100k-token context leaves room
  for a batch of a few sequences however fast the step. Need = concurrency / b, the
  concurrency at the step the batch runs: the budget, or for a KV-bound batch its own
  (shorter) step, ``decode_step_ms(b, b * ctx)``.
* **Worker** (aggregated): prefill and decode share the replica's time, so the needs add.
* **The first streamed chunk.** Engines that coalesce ``k`` tokens per streamed chunk
  (``--stream-interval k``) send a client its first token only after ``k - 1`` decode steps
  past the prefill, so TTFT = queue + prefill + ``(k - 1)`` steps. With ``k > 1`` and a TTFT
  target, :class:`FirstChunk` splits that target: the decode step is bounded by
  ``share * ttft / (k - 1)`` as well as by the TPOT budget (a smaller batch, so more decode
  replicas), and the prefill is sized for what the steps leave, ``ttft - (k - 1) * step``.
  At ``k = 1`` (vLLM's and SGLang's default) nothing changes.

A target of 0 (none) sizes by throughput alone (``max_utilization``, and for decode the
batch whose step is at most 4x the batch-1 step). An unreachable target (one request alone
takes longer) is flagged ``feasible=False`` and sized at the utilisation ceiling.
Prefill needs are whole replicas (the M/M/c search); decode needs are fractional.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

_EPS = 1e-9

__all__ = [
    "Demand",
    "FirstChunk",
    "Need",
    "PerfLike",
    "Targets",
    "decode_need",
    "erlang_c",
    "prefill_need",
]


class PerfLike(Protocol):
    """Step times of one replica (``services.common.perfmodel.PerfProfile`` is one; so is
    the telemetry's fitted model through :class:`services.common.planner.inputs.PerfView`)."""

    def prefill_ms(self, uncached_tokens: int, cached_tokens: int = 0) -> float: ...

    def decode_step_ms(self, batch: int, context_tokens: int) -> float: ...

    @property
    def kv_capacity_tokens(self) -> int:
        """Tokens of KV one replica holds (0: unknown, no bound)."""
        ...


@dataclass(frozen=True)
class Demand:
    rate_rps: float
    input_tokens: float
    output_tokens: float
    hit_ratio: float = 0.0
    backlog: float = 0.0  # requests queued now, waiting for prefill
    lead_s: float = 0.0  # how long until replicas asked for now can serve


@dataclass(frozen=True)
class Targets:
    ttft_ms: float = 0.0
    tpot_ms: float = 0.0
    percentile: float = 90.0


@dataclass(frozen=True)
class FirstChunk:
    """How a client's first token is delivered (module rule): ``tokens`` per first streamed
    chunk, and the share of the TTFT target its decode steps may use."""

    tokens: int = 1
    share: float = 0.5

    def step_budget_ms(self, t: Targets, headroom: float) -> float | None:
        """The longest decode step both targets allow (None: no target bounds it)."""
        budgets = [t.tpot_ms * headroom] if t.tpot_ms > 0 else []
        if self.tokens > 1 and t.ttft_ms > 0:
            budgets.append(self.share * t.ttft_ms / (self.tokens - 1))
        return min(budgets) if budgets else None

    def prefill_target_ms(self, t: Targets, headroom: float) -> float:
        """The TTFT target left to the prefill once the first chunk's steps are paid."""
        step = self.step_budget_ms(t, headroom)
        if self.tokens <= 1 or t.ttft_ms <= 0 or step is None:
            return t.ttft_ms
        return t.ttft_ms - (self.tokens - 1) * step


@dataclass(frozen=True)
class Need:
    replicas: float  # fractional
    feasible: bool
    detail: str


def erlang_c(servers: int, load: float) -> float:
    """Probability that an arrival waits in M/M/c with ``servers`` and offered ``load``
    (Erlang B by its stable recursion, then C); 1.0 when ``load >= servers``."""
    if load <= 0:
        return 0.0
    if load >= servers:
        return 1.0
    b = 1.0
    for k in range(1, servers + 1):
        b = load * b / (k + load * b)
    return servers * b / (servers - load * (1.0 - b))


def prefill_need(
    perf: PerfLike,
    d: Demand,
    t: Targets,
    max_utilization: float,
    first: FirstChunk = FirstChunk(),
    headroom: float = 1.0,
) -> Need:
    """``headroom``: the decode headroom, which bounds the first chunk's steps."""
    target = first.prefill_target_ms(t, headroom)
    if target != t.ttft_ms:
        t = Targets(target, t.tpot_ms, t.percentile)
    uncached = max(1, round(d.input_tokens * (1.0 - d.hit_ratio)))
    s = perf.prefill_ms(uncached)
    load = d.rate_rps * s / 1000.0  # offered load, in busy replicas
    floor = load / max_utilization
    feasible = t.ttft_ms <= 0 or t.ttft_ms > s
    if load <= 0:
        servers = 0.0
    elif t.ttft_ms <= 0 or not feasible:
        servers = floor
    else:
        slack_s = (t.ttft_ms - s) / 1000.0
        miss = 1.0 - t.percentile / 100.0
        c = max(1, math.ceil(floor - _EPS))
        while erlang_c(c, load) * math.exp(-(c - load) / (s / 1000.0) * slack_s) > miss:
            c += 1
        servers = float(c)
    horizon_ms = max(t.ttft_ms, d.lead_s * 1000.0)
    backlog = d.backlog * s / horizon_ms if horizon_ms > 0 and d.backlog > 0 else 0.0
    detail = (
        f"{d.rate_rps:.2f} req/s x {uncached} uncached tok ({s:.1f} ms), load {load:.2f}"
        + (f" + backlog {d.backlog:.0f} req" if backlog else "")
        + ("" if feasible else f"; ttft target {t.ttft_ms:g} ms < one prefill {s:.1f} ms")
    )
    return Need(servers + backlog, feasible, detail)


def max_batch(perf: PerfLike, ctx: int, budget_ms: float) -> int:
    lo, hi = 0, 1
    while hi <= 1 << 16 and perf.decode_step_ms(hi, hi * ctx) <= budget_ms:
        lo, hi = hi, hi * 2
    while hi - lo > 1:  # largest b with step(b) <= budget in (lo, hi)
        mid = (lo + hi) // 2
        if perf.decode_step_ms(mid, mid * ctx) <= budget_ms:
            lo = mid
        else:
            hi = mid
    return lo


def decode_need(
    perf: PerfLike, d: Demand, t: Targets, headroom: float, first: FirstChunk = FirstChunk()
) -> Need:
    ctx = max(1, round(d.input_tokens + d.output_tokens / 2))
    bound = first.step_budget_ms(t, headroom)
    budget = bound if bound is not None else 4.0 * perf.decode_step_ms(1, ctx)
    batch = max_batch(perf, ctx, budget)
    kv = perf.kv_capacity_tokens
    kv_bound = kv > 0 and kv // ctx < batch
    if kv_bound:
        batch = kv // ctx
    feasible = batch > 0
    if not feasible:
        step = perf.decode_step_ms(1, ctx)
    elif kv_bound:  # its step is shorter than the budget: sequences finish sooner, so
        step = perf.decode_step_ms(batch, batch * ctx)  # fewer are in flight
    else:
        step = budget
    concurrency = d.rate_rps * d.output_tokens * step / 1000.0
    need = concurrency / max(1, batch)
    detail = f"concurrency {concurrency:.1f} / batch {batch} at step <= {step:.1f} ms"
    tpot_budget = t.tpot_ms * headroom if t.tpot_ms > 0 else None
    if first.tokens > 1 and t.ttft_ms > 0 and bound is not None and bound != tpot_budget:
        detail += f" (first chunk: {first.tokens - 1} steps in {first.share:g} of the TTFT target)"
    if kv_bound:
        detail += f" (KV-bound: {kv} tokens / context {ctx})"
    if not feasible:
        detail += (
            f"; context {ctx} > KV {kv} tokens"
            if kv_bound
            else f"; step budget {budget:g} ms < one step"
        )
    return Need(need, feasible, detail)
