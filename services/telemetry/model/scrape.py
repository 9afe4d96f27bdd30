"""Decode samples from an engine's Prometheus page (pure), for engines that publish no load
snapshots. Parsed with ``prometheus_client``'s parser; both dialects the simulator serves
(:mod:`services.engine.metrics`) and the real engines use:

* running batch: ``sglang:num_running_reqs`` / ``vllm:num_requests_running``;
* context tokens in KV: ``sglang:num_used_tokens`` (SGLang; the simulator serves it in both
  dialects), else KV usage (``sglang:token_usage`` / ``vllm:kv_cache_usage_perc`` /
  ``vllm:gpu_cache_usage_perc``) times the prior's KV capacity;
* inter-token latency: the ``*:inter_token_latency_seconds`` histogram's ``_sum`` and
  ``_count``; between two scrapes their increments give the mean ITL of the interval.

One sample per interval with new ITL observations: ``(b = running now, c, mean ITL)``.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from services.telemetry.model.state import DecodeObservation

__all__ = ["EngineFigures", "decode_between", "parse_engine_page"]

_RUNNING = ("sglang:num_running_reqs", "vllm:num_requests_running")
_USED = ("sglang:num_used_tokens", "vllm:num_used_tokens")
_USAGE = ("sglang:token_usage", "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
_ITL = ("sglang:inter_token_latency_seconds", "vllm:inter_token_latency_seconds")


@dataclass(frozen=True)
class EngineFigures:
    running: float
    used_tokens: float | None
    kv_usage: float
    itl_sum_s: float
    itl_count: float


def parse_engine_page(text: str) -> EngineFigures | None:
    """The figures of one ``/metrics`` page (sums over label sets); None when neither
    dialect's running gauge is there, or for a page that does not parse."""
    vals: dict[str, float] = {}
    try:
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                vals[s.name] = vals.get(s.name, 0.0) + float(s.value)
    except ValueError:  # not a Prometheus text page
        return None
    running = next((vals[n] for n in _RUNNING if n in vals), None)
    if running is None:
        return None
    used = next((vals[n] for n in _USED if n in vals), None)
    usage = next((vals[n] for n in _USAGE if n in vals), 0.0)
    itl = next((n for n in _ITL if n + "_count" in vals), None)
    total = vals.get(itl + "_sum", 0.0) if itl else 0.0
    count = vals.get(itl + "_count", 0.0) if itl else 0.0
    return EngineFigures(running, used, usage, total, count)


def decode_between(
    prev: EngineFigures,
    cur: EngineFigures,
    *,
    deployment: str,
    instance_id: str,
    kv_capacity_tokens: int,
) -> DecodeObservation | None:
    """The decode sample of the interval between two pages; None without new ITL
    observations or a running batch (or after a counter reset)."""
    n = cur.itl_count - prev.itl_count
    if n <= 0 or cur.running <= 0:
        return None
    itl_ms = 1000.0 * (cur.itl_sum_s - prev.itl_sum_s) / n
    if itl_ms <= 0:
        return None
    ctx = cur.used_tokens if cur.used_tokens is not None else cur.kv_usage * kv_capacity_tokens
    return DecodeObservation(deployment, instance_id, cur.running, ctx, itl_ms)
