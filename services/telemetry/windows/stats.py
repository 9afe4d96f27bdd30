"""A window's statistics from the buckets it covers (pure).

The window ending at ``end_ms`` over ``window_s`` covers the whole buckets from
``align(end_ms - window_s)`` to ``end_ms`` (the last one possibly still filling); rates divide
by that span, ``end_ms - start_ms``, so a window is never diluted by a partial bucket.

Totals count request-level counters once: when the total spans every role, the counters of
``decode`` slices (which repeat those of their ``prefill`` twin, see
:mod:`services.telemetry.windows.bucket`) are left out; their sketches (TPOT, e2e, output
tokens) are kept.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from services.telemetry.windows.bucket import BucketKey, SliceKey, Summary, align, merge_summaries
from services.telemetry.windows.classes import SLOClass

__all__ = [
    "ClassAttainment",
    "Filters",
    "Percentiles",
    "WindowStats",
    "merge_slices",
    "window_bounds",
    "window_stats",
]


@dataclass(frozen=True)
class Filters:
    """``""`` = every value of that dimension."""

    deployment: str = ""
    role: str = ""
    slo_class: str = ""
    tenant: str = ""

    def admits(self, key: SliceKey) -> bool:
        return (
            (not self.deployment or key.deployment == self.deployment)
            and (not self.role or key.role == self.role)
            and (not self.slo_class or key.slo_class == self.slo_class)
            and (not self.tenant or key.tenant == self.tenant)
        )


@dataclass(frozen=True)
class Percentiles:
    mean: float = 0.0
    p50: float = 0.0
    p90: float = 0.0
    p99: float = 0.0


@dataclass(frozen=True)
class ClassAttainment:
    slo_class: str
    percentile: float
    ttft_target_ms: float
    tpot_target_ms: float
    ttft_ms: float
    tpot_ms: float
    ttft_attainment: float
    tpot_attainment: float
    met: bool


@dataclass(frozen=True)
class WindowStats:
    """Mirrors ``tideserve.v1.WindowStats`` (field meanings on the .proto)."""

    deployment: str
    role: str
    slo_class: str
    tenant: str
    start_ms: int
    end_ms: int
    requests: int
    request_rate_rps: float
    input_tokens_per_s: float
    output_tokens_per_s: float
    input_tokens: Percentiles
    output_tokens: Percentiles
    queue_ms: Percentiles
    ttft_ms: Percentiles
    tpot_ms: Percentiles
    e2e_ms: Percentiles
    kv_transfer_ms: Percentiles
    cache_hit_ratio: float
    cached_tokens_abs_error: float
    cached_tokens_error_ratio: float
    goodput_rps: float
    slo_attainment: float
    error_rate: float
    shed_rate: float
    classes: tuple[ClassAttainment, ...] = ()


def window_bounds(end_ms: int, window_s: float, bucket_ms: int) -> tuple[int, int]:
    """``(start_ms, end_ms)``: ``start_ms`` is the bucket start at or before ``end - window``."""
    if window_s <= 0:
        raise ValueError(f"window_s must be > 0, got {window_s}")
    return align(end_ms - round(window_s * 1000), bucket_ms), end_ms


def merge_slices(
    buckets: Iterable[tuple[BucketKey, Summary]], start_ms: int, end_ms: int, filters: Filters
) -> dict[SliceKey, Summary]:
    """Merge the buckets in ``[start_ms, end_ms)`` passing ``filters``, per slice."""
    groups: dict[SliceKey, list[Summary]] = {}
    for (key, bstart), b in buckets:
        if start_ms <= bstart < end_ms and filters.admits(key):
            groups.setdefault(key, []).append(b)
    return {key: merge_summaries(parts) for key, parts in groups.items()}


def window_stats(
    slices: Mapping[SliceKey, Summary],
    start_ms: int,
    end_ms: int,
    filters: Filters,
    classes: Mapping[str, SLOClass],
) -> tuple[WindowStats, list[WindowStats]]:
    """The total over ``slices`` (keyed by the filters) and one stats per slice, sorted."""
    span_s = max(end_ms - start_ms, 1) / 1000.0
    keys = sorted(slices)
    counted = [bool(filters.role) or k.role != "decode" for k in keys]
    total = merge_summaries((slices[k] for k in keys), counters_of=counted.__getitem__)
    attain = []
    for name in sorted({k.slo_class for k in keys}):
        if name not in classes:
            continue
        idx = [i for i, k in enumerate(keys) if k.slo_class == name]
        of_class = [counted[i] for i in idx]
        part = merge_summaries((slices[keys[i]] for i in idx), counters_of=of_class.__getitem__)
        attain.append(_attainment(name, part, classes[name]))
    key = SliceKey(filters.deployment, filters.role, filters.slo_class, filters.tenant)
    out_total = _stats(key, total, start_ms, end_ms, span_s, tuple(attain))
    out_slices = [_stats(k, slices[k], start_ms, end_ms, span_s, ()) for k in keys]
    return out_total, out_slices


def _ratio(num: float, den: float) -> float:
    return num / den if den else 0.0


def percentiles(b: Summary, name: str) -> Percentiles:
    sk = b.sketches.get(name)
    if sk is None or not sk.count:
        return Percentiles()
    p50, p90, p99 = sk.quantiles((0.5, 0.9, 0.99))
    return Percentiles(sk.sum / sk.count, p50, p90, p99)


def quantile(b: Summary, name: str, q: float) -> float:
    sk = b.sketches.get(name)
    if sk is None or not sk.count:
        return 0.0
    return float(sk.get_quantile_value(q) or 0.0)


def _attainment(name: str, b: Summary, cls: SLOClass) -> ClassAttainment:
    c = b.values()
    ttft_att = _ratio(c["ttft_met"], c["count"])
    tpot_att = _ratio(c["tpot_met"], c["count"])
    need = cls.percentile / 100.0
    return ClassAttainment(
        slo_class=name,
        percentile=cls.percentile,
        ttft_target_ms=cls.ttft_ms,
        tpot_target_ms=cls.tpot_ms,
        ttft_ms=quantile(b, "ttft_ms", need),
        tpot_ms=quantile(b, "tpot_ms", need),
        ttft_attainment=ttft_att,
        tpot_attainment=tpot_att,
        met=c["count"] > 0 and ttft_att >= need and tpot_att >= need,
    )


def _stats(
    key: SliceKey,
    b: Summary,
    start_ms: int,
    end_ms: int,
    span_s: float,
    classes: Sequence[ClassAttainment],
) -> WindowStats:
    c = b.values()
    return WindowStats(
        deployment=key.deployment,
        role=key.role,
        slo_class=key.slo_class,
        tenant=key.tenant,
        start_ms=start_ms,
        end_ms=end_ms,
        requests=int(c["count"]),
        request_rate_rps=c["arrivals"] / span_s,
        input_tokens_per_s=c["input_tokens_sum"] / span_s,
        output_tokens_per_s=c["output_tokens_sum"] / span_s,
        input_tokens=percentiles(b, "input_tokens"),
        output_tokens=percentiles(b, "output_tokens"),
        queue_ms=percentiles(b, "queue_ms"),
        ttft_ms=percentiles(b, "ttft_ms"),
        tpot_ms=percentiles(b, "tpot_ms"),
        e2e_ms=percentiles(b, "e2e_ms"),
        kv_transfer_ms=percentiles(b, "kv_transfer_ms"),
        cache_hit_ratio=_ratio(c["cached_tokens_sum"], c["prompt_tokens_sum"]),
        cached_tokens_abs_error=_ratio(c["router_abs_error_sum"], c["router_samples"]),
        cached_tokens_error_ratio=_ratio(c["router_abs_error_sum"], c["prompt_tokens_sum"]),
        goodput_rps=c["slo_met"] / span_s,
        slo_attainment=_ratio(c["slo_met"], c["count"]),
        error_rate=_ratio(c["errors"], c["count"]),
        shed_rate=_ratio(c["sheds"], c["count"]),
        classes=tuple(classes),
    )
