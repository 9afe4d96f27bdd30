"""An engine's load as it reports it: the report type and the ``GET /metrics`` scrape.

Shared by the scheduler (the gateway's load poll, its stream feed) and the autoscaler (the
planner's per-instance load, the drain wait). ``parse_metrics`` is pure; ``scrape_load`` is
the one HTTP call (aiohttp I/O only).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import aiohttp

__all__ = ["LoadReport", "parse_metrics", "scrape_load"]


@dataclass(frozen=True, slots=True)
class LoadReport:
    running: int = 0
    waiting: int = 0
    tokens_in_flight: int = 0
    pending_prefill_tokens: int = 0
    kv_usage: float = 0.0
    prefill_tokens_per_s: float = 0.0
    decode_tokens_per_s: float = 0.0
    kv_capacity_tokens: int = 0  # 0: not reported


_METRIC = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+([-+0-9.eEinfNa]+)")

# KV capacity: vLLM's info gauge carries it in labels (num_gpu_blocks x block_size), SGLang
# reports it in tokens.
_VLLM_CACHE_INFO = "vllm:cache_config_info"
_SGLANG_CAPACITY = "sglang:max_total_num_tokens"
_LABEL = re.compile(r'(num_gpu_blocks|block_size)="(\d+)"')

# (running, waiting, kv usage) metric names per engine dialect.
_DIALECTS = (
    ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage"),
    ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"),
    ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:gpu_cache_usage_perc"),
)


def parse_metrics(text: str) -> LoadReport | None:
    """Load figures from a Prometheus text page of SGLang or vLLM (sums over label sets;
    the KV capacity from ``vllm:cache_config_info`` or ``sglang:max_total_num_tokens``).
    None when neither dialect is present. Samples that are not finite (``NaN``, ``+Inf``)
    are ignored and negative counts read as 0: a bad page never breaks the load poll."""
    vals: dict[str, float] = {}
    capacity = 0
    for line in text.splitlines():
        m = _METRIC.match(line)
        if m and m.group(1) == _VLLM_CACHE_INFO and m.group(2):
            capacity += _vllm_capacity(m.group(2))
        elif m:
            try:
                value = float(m.group(3))
            except ValueError:
                continue
            if math.isfinite(value):
                vals[m.group(1)] = vals.get(m.group(1), 0.0) + value
    for run, wait, kv in _DIALECTS:
        if run in vals or wait in vals:
            total = vals.get(run, 0.0) + vals.get(wait, 0.0) + vals.get(kv, 0.0)
            if not math.isfinite(total):  # finite samples can still sum to infinity
                return None
            return LoadReport(
                running=max(0, int(vals.get(run, 0))),
                waiting=max(0, int(vals.get(wait, 0))),
                kv_usage=float(vals.get(kv, 0.0)),
                kv_capacity_tokens=capacity or max(0, int(vals.get(_SGLANG_CAPACITY, 0.0))),
            )
    return None


def _vllm_capacity(labels: str) -> int:
    """KV tokens from ``vllm:cache_config_info``'s labels (0 when either is missing)."""
    got = dict(_LABEL.findall(labels))
    return int(got.get("num_gpu_blocks", 0)) * int(got.get("block_size", 0))


async def scrape_load(
    session: aiohttp.ClientSession, url: str, timeout_s: float
) -> LoadReport | None:
    """``url``'s load from its ``/metrics`` page; None when it cannot be read or parsed."""
    try:
        async with session.get(
            url + "/metrics", timeout=aiohttp.ClientTimeout(total=timeout_s)
        ) as r:
            if r.status != 200:
                return None
            return parse_metrics(await r.text())
    except (aiohttp.ClientError, TimeoutError, OSError, UnicodeDecodeError):
        return None
