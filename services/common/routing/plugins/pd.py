"""P/D decider: disaggregate only when the uncached suffix is long enough (and, optionally,
only when the prefill pool is not the slower path) — and always when the deployment's
decode instances cannot compute a prompt (``PluginEnv.decode_can_prefill``)."""

from __future__ import annotations

from pydantic import Field

from services.common.routing.framework import CycleContext
from services.common.routing.plugins.pending import PendingPicks
from services.common.routing.registry import (
    Params,
    PluginEnv,
    model_version,
    prefill_tps,
    register,
)
from services.common.routing.types import Choice, Pick, RequestView


class PDDeciderParams(Params):
    threshold_tokens: int = Field(512, ge=0)
    # Load rule: a long suffix is still computed on the decode instance when the prefill
    # path is predicted slower by more than local_margin_ms (see the class docstring).
    load_rule: bool = False
    local_margin_ms: float = Field(0.0, ge=0)
    # Name in services.common.perfmodel.PROFILES for the prefill pool's throughput.
    perf_profile: str = ""
    chunk_tokens: int = Field(4096, gt=0)
    # Disaggregated picks not settled after this long stop counting as prefill backlog.
    backlog_ttl_s: float = Field(600.0, gt=0)


@register("pd-decider", PDDeciderParams)
class PDDecider:
    """Disaggregate iff prompt tokens minus the tokens estimated cached on the chosen decode
    instance (by the prefix plugins of the decode profile) is at least ``threshold_tokens``;
    otherwise the decode (or aggregated) instance computes the prompt itself.

    Load rule (``load_rule``): the decider also counts the uncached tokens of
    this gateway's disaggregated picks that have not answered yet, per prefill instance
    (``on_pick``/``on_settle``); the prefill path's wait is the least of those backlogs /
    model prefill throughput over the prefill instances it has picked. A long suffix stays
    local when the decode instance's predicted TTFT (``ctx.predicted_ttft_ms``, from a
    ttft-cost plugin of the decode profile) is below that wait plus the same prefill, by
    more than the margin. With an idle prefill pool (or no prediction) it disaggregates.

    Capability: when the deployment's decode instances cannot compute a prompt
    (``env.decode_can_prefill`` false, e.g. SGLang decode servers in disaggregation mode),
    every request picked onto a decode-role instance is disaggregated, whatever its
    uncached length or the prefill backlog; worker (aggregated) instances never are."""

    def __init__(self, name: str, params: PDDeciderParams, env: PluginEnv) -> None:
        self.name = name
        self.p = params
        self.threshold = params.threshold_tokens
        self.decode_can_prefill = env.decode_can_prefill
        self.model = env.perf_profile(params.perf_profile)
        self._version = model_version(self.model)
        self._tps = self._throughput()
        # prefill instance -> uncached tokens of its unanswered disaggregated picks
        self._backlog = PendingPicks(params.backlog_ttl_s)

    def _throughput(self) -> float:
        return prefill_tps(self.model, self.p.chunk_tokens)

    @property
    def tps(self) -> float:
        """The model's prefill throughput (recomputed when the fitted model changes)."""
        v = model_version(self.model)
        if v != self._version:
            self._version, self._tps = v, self._throughput()
        return self._tps

    def prefill_wait_ms(self) -> float:
        """Predicted wait on the least backlogged prefill instance seen so far (0 if none)."""
        if not self._backlog.totals:
            return 0.0
        return 1000.0 * min(self._backlog.totals.values()) / self.tps

    def disaggregate(self, ctx: CycleContext, request: RequestView, decode: Choice) -> bool:
        if decode.endpoint.role == "worker":
            return False
        if not self.decode_can_prefill:
            return True
        iid = decode.endpoint.instance_id
        cached = ctx.ready_cached(iid, request.prompt_tokens)
        uncached = request.prompt_tokens - cached
        if uncached < self.threshold:
            return False
        local = ctx.predicted_ttft_ms.get(iid)
        if not self.p.load_rule or local is None:
            return True
        remote = self.prefill_wait_ms() + self.model.prefill_ms(uncached, cached)
        return not local + self.p.local_margin_ms < remote

    def on_pick(self, now: float, request: RequestView, pick: Pick) -> None:
        if not self.p.load_rule:
            return
        if pick.prefill is not None:
            n = max(0, request.prompt_tokens - pick.predicted_cached_tokens)
            self._backlog.add(request.request_id, pick.prefill.endpoint.instance_id, n, now)
        else:
            self._backlog.drop(request.request_id)
            self._backlog.expire(now)

    def on_settle(self, request: RequestView, pick: Pick, ok: bool) -> None:
        """The pick answered (its prefill is done) or failed: no longer backlog."""
        # The instance stays known (at 0), so an idle prefill instance counts as idle.
        self._backlog.drop(request.request_id)
