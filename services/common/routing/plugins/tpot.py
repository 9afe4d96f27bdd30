"""Decode-side TPOT: score endpoints by the time per output token a prefill adds to the
decodes it would be batched with (pure)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pydantic import Field

from services.common.routing.framework import CycleContext, by_instance
from services.common.routing.registry import Params, PluginEnv, register
from services.common.routing.types import EndpointView, RequestView

__all__ = ["DecodeTPOT", "DecodeTPOTParams", "stall_ms_per_token"]


class DecodeTPOTParams(Params):
    # Output tokens still to come per decode when the engine reports no tokens in flight
    # (its /metrics scrape carries none).
    decode_tokens: int = Field(256, ge=1)
    # Floor of the per-decode remaining tokens derived from the engine's report.
    min_remaining_tokens: int = Field(16, ge=1)
    # Added to every candidate's stall before taking min/stall (ms of TPOT summed over the
    # decodes): stalls this small rank equal, so short uncached suffixes (most turns of a
    # cached session) leave the ranking to the other scorers.
    epsilon_ms: float = Field(50.0, gt=0)
    # Count the requests waiting for admission (and this gateway's unreported picks) as
    # decodes too: they are prefilled before this prompt, so they decode while it prefills.
    count_queued: bool = True
    # Only prompts whose own prefill is at least this long on every candidate (ms, the
    # gateway's model): below it every candidate scores 1 (the other scorers place it).
    min_prefill_ms: float = Field(0.0, ge=0)
    # > 0: score by the stall a candidate adds beyond the least one, in absolute terms,
    # 1 - (stall - least) / spread_ms (at least 0), instead of the ratio (least + eps) /
    # (stall + eps). A ratio gives one decode against two the lead of ten against twenty;
    # this gives a candidate a lead in proportion to the TPOT it spares (ms summed over the
    # decodes), so near-idle instances gain little over lightly loaded ones.
    spread_ms: float = Field(0.0, ge=0)


def stall_ms_per_token(
    e: EndpointView, own_prefill_ms: float, p: DecodeTPOTParams
) -> tuple[int, float]:
    """(decodes, ms of TPOT each gains) when a prefill of ``own_prefill_ms`` runs on ``e``:
    chunked prefill batches its chunks with every decode step there, so each decode emits
    its remaining tokens about ``own_prefill_ms`` later, spread over those tokens (engine-
    reported tokens in flight less the prefill still queued, per running sequence; else
    ``decode_tokens``)."""
    decodes = e.running + (e.waiting + e.reserved_requests if p.count_queued else 0)
    if decodes <= 0 or own_prefill_ms <= 0.0:
        return decodes, 0.0
    remaining = max(0, e.tokens_in_flight - e.pending_prefill_tokens)
    per = remaining / e.running if e.running and remaining else float(p.decode_tokens)
    per = max(per, float(p.min_remaining_tokens))
    return decodes, own_prefill_ms / per


@register("decode-tpot", DecodeTPOTParams)
class DecodeTPOT:
    """Score = (min + eps) / (stall + eps) over the candidates, where stall is the TPOT this
    request's prefill adds to the decodes it would share a batch with, summed over them:
    ``decodes * own prefill / remaining tokens per decode`` (:func:`stall_ms_per_token`);
    with ``spread_ms`` > 0, 1 - (stall - min) / spread_ms instead (at least 0).
    ``own prefill`` is the request's uncached suffix on that candidate, priced by a
    ``ttft-cost`` plugin in the same profile (list one; without it every candidate scores
    1). A long uncached prompt (a new session's first turn) goes where it stalls the fewest
    decodes; a cached turn's short suffix stalls little anywhere and scores about 1
    everywhere (``epsilon_ms``). Over decode-role endpoints (a P/D fleet) every candidate
    scores 1."""

    def __init__(self, name: str, params: DecodeTPOTParams, env: PluginEnv) -> None:
        self.name = name
        self.p = params

    def score(
        self, ctx: CycleContext, request: RequestView, candidates: Sequence[EndpointView]
    ) -> Mapping[str, float]:
        return by_instance(candidates, self.score_list(ctx, request, candidates))

    def score_list(
        self, ctx: CycleContext, request: RequestView, candidates: Sequence[EndpointView]
    ) -> list[float]:
        """:meth:`score` aligned with ``candidates``."""
        if not candidates:
            return []
        if any(e.role == "decode" for e in candidates):
            # P/D: whether a decode engine computes the prompt is the decider's call, made
            # after this pick; a disaggregated prompt stalls the prefill pool, not these
            return [1.0] * len(candidates)
        n = request.prompt_tokens
        owns = [ctx.own_prefill_ms(e.instance_id, n) or 0.0 for e in candidates]
        if min(owns) < self.p.min_prefill_ms:
            return [1.0] * len(candidates)
        stalls = []
        for e, own in zip(candidates, owns, strict=True):
            decodes, per = stall_ms_per_token(e, own, self.p)
            stalls.append(decodes * per + self.p.epsilon_ms)
        lo = min(stalls)
        if self.p.spread_ms > 0:
            return [max(0.0, 1.0 - (s - lo) / self.p.spread_ms) for s in stalls]
        return [lo / s for s in stalls]
