"""Decode room: in a P/D fleet, send a turn's decode where its KV fits now.

A decode engine admits a handed-off request only when it has KV room for it; until then the
request waits there with its prefill done. The prefix scorers keep a session on the decode
engine holding its context, which on P/D saves only the transfer of that context (the
prefill engine computes the prompt either way), so a full home makes the turn wait for room
while other decode engines have it.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from services.common.routing.framework import CycleContext
from services.common.routing.plugins.pending import PendingPicks
from services.common.routing.registry import Params, PluginEnv, register
from services.common.routing.types import EndpointView, Pick, RequestView

__all__ = ["DecodeRoom", "DecodeRoomParams", "room_tokens"]


class DecodeRoomParams(Params):
    # The share of the request's max_tokens a decode engine reserves at admission (1: the
    # whole output, as SGLang and the simulated engines do; 0: blocks allocated as tokens
    # are generated, as vLLM does).
    output_share: float = Field(1.0, ge=0, le=1)
    # Unanswered picks older than this stop counting against their decode engine.
    pending_ttl_s: float = Field(120.0, gt=0)


def room_tokens(e: EndpointView, pending: int) -> int | None:
    """KV tokens ``e`` has for a new request: free (idle cache included) less what this
    gateway's unanswered picks will take there; None when its capacity is not reported."""
    free = e.kv_free_tokens
    return None if free is None else free - pending


@register("decode-room", DecodeRoomParams)
class DecodeRoom:
    """Filter for P/D decode picks: keep the decode-role candidates with KV room for the
    request (prompt + ``output_share`` x max_tokens), counting as taken what this gateway's
    disaggregated picks not answered yet will reserve there (``on_pick``/``on_settle``: a
    pick's KV lands on its decode engine before its first byte). When none has room, the
    ones with the most. Candidates without a reported capacity are kept; worker
    (aggregated) candidates are never removed, so an aggregated fleet's picks are unchanged.
    """

    def __init__(self, name: str, params: DecodeRoomParams, env: PluginEnv) -> None:
        self.name = name
        self.p = params
        self._pending = PendingPicks(params.pending_ttl_s)

    def need(self, request: RequestView) -> int:
        """KV tokens the request takes on its decode engine at admission."""
        return request.prompt_tokens + int(self.p.output_share * request.max_tokens)

    def filter(
        self, ctx: CycleContext, request: RequestView, candidates: Sequence[EndpointView]
    ) -> Sequence[EndpointView]:
        if len(candidates) < 2 or all(e.role != "decode" for e in candidates):
            return candidates
        need = self.need(request)
        totals = self._pending.totals
        rooms = [
            room_tokens(e, totals.get(e.instance_id, 0)) if e.role == "decode" else None
            for e in candidates
        ]
        fits = [r is None or r >= need for r in rooms]
        if any(fits):
            return [e for e, ok in zip(candidates, fits, strict=True) if ok]
        best = max(r for r in rooms if r is not None)
        return [e for e, r in zip(candidates, rooms, strict=True) if r == best]

    def on_pick(self, now: float, request: RequestView, pick: Pick) -> None:
        if pick.decode.endpoint.role != "decode":
            self._pending.drop(request.request_id)
            return
        self._pending.add(request.request_id, pick.decode.endpoint.instance_id,
                          self.need(request), now)  # fmt: skip

    def on_settle(self, request: RequestView, pick: Pick, ok: bool) -> None:
        """The pick answered (its KV is on the decode engine, in its reported usage from
        the next report on) or failed: no longer pending."""
        self._pending.drop(request.request_id)
