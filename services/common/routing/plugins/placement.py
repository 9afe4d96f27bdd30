"""Placement of new sessions by the load sessions already bring to each instance.

An agent session is a long commitment: its next turns come back to the instance that holds
its KV, each re-reading a context of tens of thousands of tokens. The load an instance will
carry is therefore better told by the prompt tokens routed to it recently than by its queue
at this instant, which is empty between two turns of the sessions it hosts.

Rule: a request is a new session's first turn when no candidate is estimated to hold at
least ``new_below`` of its prompt (``ctx.cached_tokens``, from the prefix plugins). Such a
request scores ``1 - committed(i) / max committed`` per candidate, where ``committed(i)`` is
the prompt tokens this plugin saw routed to ``i``, decayed with half-life ``half_life_s``;
every other request scores nothing, so a session's later turns follow their KV.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from pydantic import Field

from services.common.routing.framework import CycleContext
from services.common.routing.registry import Params, PluginEnv, register
from services.common.routing.types import EndpointView, Pick, RequestView


class SessionLoadParams(Params):
    new_below: float = Field(0.5, ge=0, le=1)
    half_life_s: float = Field(30.0, gt=0)
    # Only prompts at least this long are placed by commitment: a short first turn is a small
    # commitment, and the instant queue (ttft-cost) places it better.
    min_prompt_tokens: int = Field(0, ge=0)


@register("session-load", SessionLoadParams)
class SessionLoad:
    """Scores new sessions' first turns by the decayed prompt tokens routed to each
    candidate (least committed scores 1); scores nothing for other requests."""

    def __init__(self, name: str, params: SessionLoadParams, env: PluginEnv) -> None:
        self.name = name
        self.p = params
        self._rate = math.log(2.0) / params.half_life_s
        # instance -> (decayed routed prompt tokens, as of time)
        self._committed: dict[str, tuple[float, float]] = {}
        # when a set: the instances whose commitment changed since its owner last cleared it
        # (a follower of the commitments installs it, and then reads only those)
        self.touched: set[str] | None = None

    def committed(self, instance_id: str, now: float) -> float:
        v, t = self._committed.get(instance_id, (0.0, now))
        return v * math.exp(-self._rate * max(0.0, now - t))

    def score(
        self, ctx: CycleContext, request: RequestView, candidates: Sequence[EndpointView]
    ) -> Mapping[str, float]:
        n = request.prompt_tokens
        if not candidates or n <= 0 or n < self.p.min_prompt_tokens:
            return {}
        best = max((ctx.cached_tokens.get(e.instance_id, 0) for e in candidates), default=0)
        if best >= self.p.new_below * n:
            return {}
        loads = [self.committed(e.instance_id, ctx.now) for e in candidates]
        top = max(loads)
        if top <= 0:
            return {}
        return {e.instance_id: 1.0 - x / top for e, x in zip(candidates, loads, strict=True)}

    def on_pick(self, now: float, request: RequestView, pick: Pick) -> None:
        iid = (pick.prefill or pick.decode).endpoint.instance_id
        self._committed[iid] = (self.committed(iid, now) + request.prompt_tokens, now)
        if self.touched is not None:
            self.touched.add(iid)
