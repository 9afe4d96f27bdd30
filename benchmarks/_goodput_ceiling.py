"""A cell's ceiling: the share of requests no router could serve within the TTFT SLO.

A request is hopeless when its prefill alone, on an idle engine with the best cache any
router could have given it, plus the ``stream_interval - 1`` decode steps before the first
streamed chunk, exceeds the TTFT SLO. The best cache is the longest prefix of its blocks
that an earlier request of the slice carried and could have finished computing, on an idle
engine, before it arrived (an engine caches a prompt's blocks when its prefill ends, so a
turn sent while its predecessor still prefills recomputes). ``max_attainment`` = 1 - the
hopeless share.

The ceiling depends on the requests' arrivals and prompts alone, not on any router, so
``goodput_sim.py`` takes them from a simulated run and ``goodput_live.py`` from the trace
slice it replays live (:func:`slice_requests`: the same arrivals and prompt tokens as the
simulator's and the bench's).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from services.common.bench.traces import Trace
from services.common.perfmodel import get_profile
from services.common.tokens import block_hashes
from services.sim.inputs import Prompts, arrivals

__all__ = ["CeilingRequest", "ceiling_of", "slice_requests"]


@dataclass(frozen=True)
class CeilingRequest:
    arrival_ms: float
    prompt_tokens: int
    block_hashes: Sequence[int]


def ceiling_of(
    requests: Iterable[CeilingRequest],
    *,
    engine_profile: str,
    stream_interval: int,
    block_size: int,
    slo_ttft_ms: float,
) -> dict[str, Any]:
    """``infeasible_share`` and ``max_attainment`` of ``requests`` (module doc)."""
    perf = get_profile(engine_profile)
    first_chunk = max(0, stream_interval - 1) * perf.decode_step_ms(1, 0)
    # block hash -> the earliest time (ms) its KV can exist: the end of the idle prefill of
    # the first request that could have computed it
    ready: dict[int, float] = {}
    hopeless = total = 0
    for r in sorted(requests, key=lambda r: r.arrival_ms):
        total += 1
        hashes = r.block_hashes
        matched = 0
        while matched < len(hashes) and ready.get(hashes[matched], math.inf) <= r.arrival_ms:
            matched += 1
        n = r.prompt_tokens
        cached = min(n, matched * block_size)
        own = perf.prefill_ms(n - cached, cached)
        done = r.arrival_ms + own
        for h in hashes:
            if ready.get(h, math.inf) > done:
                ready[h] = done
        if own + first_chunk > slo_ttft_ms:
            hopeless += 1
    share = hopeless / max(1, total)
    return {"infeasible_share": round(share, 4), "max_attainment": round(1.0 - share, 4)}


def slice_requests(
    trace: Trace, offset: int, max_requests: int, rate_divisor: float, block_size: int
) -> list[CeilingRequest]:
    """The requests ``offset`` .. ``offset + max_requests`` of ``trace`` as replayed with
    arrivals divided by ``rate_divisor`` (rate scale x speedup), tokenized as the bench's
    prompts reach the gateway and the engines."""
    prompts = Prompts()
    out = []
    for at, r in arrivals(trace, max_requests, rate_divisor, offset):
        toks = prompts.tokens(r)
        out.append(CeilingRequest(at, len(toks), tuple(block_hashes(toks, block_size))))
    return out
