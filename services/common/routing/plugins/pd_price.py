"""P/D decider that prices both paths of a turn: the decode engine computing the prompt
itself, or the prefill pool's pick, the KV transfer and the hand-off."""

from __future__ import annotations

from pydantic import Field

from services.common.routing.framework import CycleContext
from services.common.routing.registry import Params, PluginEnv, PrefillModel, register
from services.common.routing.types import Choice, RequestView


class PDPriceParams(Params):
    # An uncached suffix on the decode engine shorter than this stays there unpriced.
    threshold_tokens: int = Field(512, ge=0)
    # Keep a turn local when its predicted TTFT there is at most the P/D path's + margin_ms
    # (negative: the local path must be predicted faster by that much).
    margin_ms: float = 0.0
    # Decode contention (0 = off): the local path also costs stall * (running + this
    # gateway's unreported picks on the decode engine) * its own prefill: the decodes there
    # stream that much later and hold their KV that much longer (the prefill pool has none).
    stall: float = Field(0.0, ge=0)
    # Backlog gate (0 = off): a decode engine reporting at least this many waiting requests
    # (no KV room or batch slot for them) computes no long suffix. A local turn waits for
    # that admission and then prefills; on the P/D path the wait overlaps its prefill.
    busy_waiting: int = Field(0, ge=0)
    # Name in services.common.perfmodel.PROFILES for the transfer and stall pricing; "" =
    # the default profile. The paths' queues and prefills come from the ttft-cost plugins.
    perf_profile: str = ""
    # Cold contexts (0 = off): a turn with at least this many uncached tokens whose decode
    # engine holds no more of the prompt than the prefill pick (a session's first prompt, a
    # moved session) is disaggregated unless the P/D path is predicted more than
    # cold_slack x the local path slower. Where it is computed is where its context stays:
    # on the prefill pool, the session's next long suffixes can go there and the decode
    # engine keeps serving the turns of the sessions it holds.
    cold_tokens: int = Field(0, ge=0)
    cold_slack: float = Field(0.25, ge=0)


@register("pd-price", PDPriceParams)
class PDPrice:
    """Where decode engines can compute prompts (``env.decode_can_prefill``), compare the
    predicted TTFT of the two paths of a decode-role pick with an uncached suffix of at
    least ``threshold_tokens``:

    * local: the decode profile's ttft-cost prediction for the decode engine (the prefill
      queued ahead there, then the prompt less what that engine holds), plus ``stall`` x
      the decodes running there x that prefill;
    * P/D: the prefill profile's ttft-cost prediction for its own pick (that engine's
      queue, the prompt less what *it* holds), plus the modelled transfer of the prompt
      tokens the decode engine does not hold.

    A cold context (``cold_tokens``: a long prompt the decode engine holds no more of than
    the prefill pick) is disaggregated unless P/D > local x (1 + ``cold_slack``). Otherwise
    the turn stays local when local <= P/D + ``margin_ms``, unless the decode engine reports
    ``busy_waiting`` or more waiting requests (backlogged: the local path queues behind
    them before it prefills, the P/D path waits for them while it prefills, so the turn is
    disaggregated). A shorter suffix stays local unpriced. The framework runs the prefill
    profile before asking (:meth:`confirm`); with no prediction on either side the turn is
    disaggregated. Where decode engines cannot compute a prompt every decode-role pick is
    disaggregated; worker (aggregated) picks never are."""

    def __init__(self, name: str, params: PDPriceParams, env: PluginEnv) -> None:
        self.name = name
        self.p = params
        self.decode_can_prefill = env.decode_can_prefill
        self.model: PrefillModel = env.perf_profile(params.perf_profile)

    def disaggregate(self, ctx: CycleContext, request: RequestView, decode: Choice) -> bool:
        """Whether the turn may be disaggregated: pricing (``confirm``) has the last word."""
        if decode.endpoint.role == "worker":
            return False
        if not self.decode_can_prefill:
            return True
        iid = decode.endpoint.instance_id
        uncached = request.prompt_tokens - ctx.ready_cached(iid, request.prompt_tokens)
        return uncached >= self.p.threshold_tokens

    def confirm(
        self, ctx: CycleContext, request: RequestView, decode: Choice, prefill: Choice
    ) -> bool:
        """Given the prefill profile's pick, whether the P/D path is predicted faster."""
        if not self.decode_can_prefill or decode.endpoint.role == "worker":
            return True
        if 0 < self.p.busy_waiting <= decode.endpoint.waiting:
            return True
        local = ctx.predicted_ttft_ms.get(decode.endpoint.instance_id)
        if local is not None and self.p.stall:
            local += self.stall_ms(ctx, request, decode)
        remote = self.remote_ms(ctx, request, decode, prefill)
        if local is None or remote is None:
            return True
        if self.cold(ctx, request, decode, prefill):
            return remote <= local * (1.0 + self.p.cold_slack)
        return not local <= remote + self.p.margin_ms

    def cold(
        self, ctx: CycleContext, request: RequestView, decode: Choice, prefill: Choice
    ) -> bool:
        """A long prompt whose decode engine holds no more of it than the prefill pick."""
        if not self.p.cold_tokens:
            return False
        n = request.prompt_tokens
        held = ctx.ready_cached(decode.endpoint.instance_id, n)
        pool = ctx.ready_cached(prefill.endpoint.instance_id, n)
        return n - held >= self.p.cold_tokens and held <= pool

    def remote_ms(
        self, ctx: CycleContext, request: RequestView, decode: Choice, prefill: Choice
    ) -> float | None:
        """Predicted TTFT of the P/D path: the prefill pick's, then the KV transfer."""
        t = ctx.predicted_ttft_ms.get(prefill.endpoint.instance_id)
        if t is None:
            return None
        resident = ctx.ready_cached(decode.endpoint.instance_id, request.prompt_tokens)
        return t + self.transfer_ms(request.prompt_tokens - resident)

    def stall_ms(self, ctx: CycleContext, request: RequestView, decode: Choice) -> float:
        """The decode contention term of the local path (see ``stall``)."""
        e = decode.endpoint
        cached = ctx.ready_cached(e.instance_id, request.prompt_tokens)
        own = self.model.prefill_ms(request.prompt_tokens - cached, cached)
        return self.p.stall * (e.running + e.reserved_requests) * own

    def transfer_ms(self, tokens: int) -> float:
        xfer = getattr(self.model, "transfer_ms", None)
        return float(xfer(tokens)) if callable(xfer) and tokens > 0 else 0.0
