"""Replica counts that meet every SLO class's TTFT and TPOT targets for a traffic mix, at
least cost, and the constraint that binds (pure).

Prefill (per prefill or worker replica): an M/G/1 server. Requests arrive at ``lam/R`` each
(round-robin-ish routing splits a Poisson stream into roughly Poisson ones); the service
time is the fitted ``prefill_ms`` of the uncached prompt (``input * (1 - hit ratio)``).
Engines batch prefill chunks, but the fitted time is close to linear in tokens, so a batch
costs about the sum of its prompts: FIFO over tokens behaves like one server. With input
lengths lognormal (median p50, spread from p90: ``sigma = ln(p90/p50) / 1.2816``), ``E[S]`` and
``E[S²] = E[S]² (1 + cv²)``, Pollaczek-Khinchine gives the mean wait ``W = lam_r E[S²] /
(2(1 - rho))``; the wait's tail is taken exponential with the mean conditional wait ``W/rho``
(exact for M/M/1): ``P(wait > t) = rho exp(-rho t / W)``, so the class's percentile ``p`` wait
is ``(W/rho) ln(rho / (1 - p))`` (0 when ``rho <= 1 - p``). A class is met when that wait plus
the prefill of a percentile-``p`` prompt (plus the KV transfer in P/D) fits its TTFT
target, with ``rho`` under ``max_utilization``. The least (real) ``R`` is found by bisection
(the wait falls monotonically with ``R``).

Decode: a step of ``b`` sequences takes ``decode_step_ms(b, b * (input + output / 2))``
(mean context at mid-generation), so the TPOT target caps the batch at ``b_tpot``; KV
capacity caps it at ``kv_capacity_tokens / (input + output)``, the engine at
``max_batch``. By Little's law ``lam * output * step(b_max) / 1000`` sequences decode at
once, ``b_max`` per replica. The TPOT of a request is its mean inter-token time, so the
class's percentile is met when the step at the full batch is.

Layouts: P/D sizes each pool alone (prefill ``ceil(R_p)``, decode ``ceil(R_d)``); aggregated
workers time-share both phases, so the fractional needs add (``ceil(R_p + R_d)``; prefill
chunks lengthening decode steps is not modelled). The binding constraint is the one behind
the larger fractional need: ``prefill:ttft:<class>``, ``decode:tpot:<class>``,
``kv-capacity``, ``max-batch``, or ``min-replicas`` (no traffic). A target no replica count
can meet (the prompt's own prefill exceeds the TTFT target) is sized for the utilisation
bound and named with ``:infeasible``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist

from services.common.perfcoef import Coefficients

__all__ = ["Capacity", "Recommendation", "SloClass", "TrafficMix", "recommend"]

_Z90 = NormalDist().inv_cdf(0.9)


@dataclass(frozen=True)
class SloClass:
    name: str
    percentile: float  # e.g. 90.0
    ttft_target_ms: float  # 0 = none
    tpot_target_ms: float  # 0 = none


@dataclass(frozen=True)
class TrafficMix:
    rate_rps: float
    input_mean: float
    input_p50: float
    input_p90: float
    output_mean: float
    hit_ratio: float


@dataclass(frozen=True)
class Capacity:
    kv_capacity_tokens: int
    kv_bytes_per_token: int
    max_batch: int = 256
    max_utilization: float = 0.9
    max_replicas: int = 1000


@dataclass(frozen=True)
class Recommendation:
    prefill_replicas: int
    decode_replicas: int
    worker_replicas: int
    pd_ratio: float
    binding: str
    reasons: tuple[str, ...]


@dataclass(frozen=True)
class _Need:
    replicas: float
    constraint: str
    reason: str


def _sigma(mix: TrafficMix) -> float:
    if mix.input_p50 <= 0 or mix.input_p90 <= mix.input_p50:
        return 0.0
    return math.log(mix.input_p90 / mix.input_p50) / _Z90


def _tail_wait(rate_per_ms: float, es: float, es2: float, p: float) -> float:
    rho = rate_per_ms * es
    if rho >= 1.0:
        return math.inf
    if rho <= 1.0 - p:
        return 0.0
    w = rate_per_ms * es2 / (2.0 * (1.0 - rho))
    return (w / rho) * math.log(rho / (1.0 - p))


def _prefill_need(
    mix: TrafficMix, c: SloClass, m: Coefficients, cap: Capacity, extra_ms: float
) -> _Need:
    h = min(1.0, max(0.0, mix.hit_ratio))
    sigma = _sigma(mix)
    p = min(0.999, max(0.5, c.percentile / 100.0))
    es = max(1e-6, m.prefill_ms(round(mix.input_mean * (1 - h))))
    es2 = es * es * math.exp(sigma * sigma)  # 1 + cv^2 of a lognormal
    median = mix.input_p50 if mix.input_p50 > 0 else mix.input_mean
    n_p = median * math.exp(sigma * NormalDist().inv_cdf(p)) * (1 - h)
    budget = c.ttft_target_ms - m.prefill_ms(round(n_p)) - extra_ms
    rate = mix.rate_rps / 1000.0
    r_util = rate * es / cap.max_utilization
    name = f"prefill:ttft:{c.name}"
    if budget <= 0:
        return _Need(r_util, f"{name}:infeasible", f"{name}: own prefill exceeds the target")

    def ok(r: float) -> bool:
        return r >= r_util and _tail_wait(rate / r, es, es2, p) <= budget

    lo, hi = max(r_util, 1e-9), max(r_util, 1.0)
    while not ok(hi):
        hi *= 2.0
        if hi > cap.max_replicas:
            return _Need(float(cap.max_replicas), f"{name}:infeasible", f"{name}: over max")
    for _ in range(60):
        mid = (lo + hi) / 2.0
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
    reason = f"{name}: {hi:.2f} replicas (E[S] {es:.1f} ms, wait budget {budget:.0f} ms)"
    return _Need(hi, name, reason)


def _decode_need(mix: TrafficMix, c: SloClass, m: Coefficients, cap: Capacity) -> _Need:
    ctx = mix.input_mean + mix.output_mean / 2.0
    per_seq = m.decode_ms_per_seq + m.decode_ms_per_ktoken * ctx / 1000.0
    name = f"decode:tpot:{c.name}"
    if c.tpot_target_ms <= 0:
        b_tpot = cap.max_batch
    elif per_seq <= 0:
        b_tpot = cap.max_batch if m.decode_base_ms < c.tpot_target_ms else 0
    else:
        b_tpot = math.floor((c.tpot_target_ms - m.decode_base_ms) / per_seq)
    b_kv = math.floor(cap.kv_capacity_tokens / max(1.0, mix.input_mean + mix.output_mean))
    b = min(b_tpot, b_kv, cap.max_batch)
    if b == b_tpot and b_tpot < min(b_kv, cap.max_batch):
        constraint = name
    elif b == b_kv and b_kv < cap.max_batch:
        constraint = "kv-capacity"
    else:
        constraint = "max-batch"
    if b < 1:
        constraint = f"{constraint}:infeasible"
        b = 1
    step = m.decode_step_ms(b, b * ctx)
    need = mix.rate_rps * mix.output_mean * step / 1000.0 / b
    return _Need(need, constraint, f"{constraint}: {need:.2f} replicas at batch {b}")


def _worst(needs: Sequence[_Need]) -> _Need:
    return max(needs, key=lambda n: n.replicas)


def recommend(
    mix: TrafficMix,
    classes: Sequence[SloClass],
    prefill_model: Coefficients,
    decode_model: Coefficients,
    cap: Capacity,
    *,
    disaggregated: bool,
) -> Recommendation:
    """See the module docstring. ``classes`` must not be empty (ValueError)."""
    if not classes:
        raise ValueError("at least one SLO class is needed")
    if mix.rate_rps <= 0:
        reasons: tuple[str, ...] = ("min-replicas: no traffic",)
        if disaggregated:
            return Recommendation(1, 1, 0, 1.0, "min-replicas", reasons)
        return Recommendation(0, 0, 1, 0.0, "min-replicas", reasons)
    extra = 0.0
    if disaggregated:
        extra = prefill_model.transfer_ms(mix.input_mean * cap.kv_bytes_per_token)
    pn = _worst([_prefill_need(mix, c, prefill_model, cap, extra) for c in classes])
    dn = _worst([_decode_need(mix, c, decode_model, cap) for c in classes])
    top = pn if pn.replicas >= dn.replicas else dn
    reasons = (pn.reason, dn.reason)
    if disaggregated:
        p = max(1, math.ceil(pn.replicas - 1e-9))
        d = max(1, math.ceil(dn.replicas - 1e-9))
        binding = top.constraint if p + d > 2 else "min-replicas"
        return Recommendation(p, d, 0, p / d, binding, reasons)
    w = max(1, math.ceil(pn.replicas + dn.replicas - 1e-9))
    binding = top.constraint if w > 1 else "min-replicas"
    return Recommendation(0, 0, w, 0.0, binding, reasons)
