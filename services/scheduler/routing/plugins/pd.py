"""P/D decider: disaggregate only when the uncached suffix is long enough."""

from __future__ import annotations

from pydantic import Field

from services.scheduler.routing.framework import CycleContext
from services.scheduler.routing.registry import Params, PluginEnv, register
from services.scheduler.routing.types import Choice, RequestView


class PDDeciderParams(Params):
    threshold_tokens: int = Field(512, ge=0)


@register("pd-decider", PDDeciderParams)
class PDDecider:
    """Disaggregate iff prompt tokens minus the tokens estimated cached on the chosen decode
    instance (by the prefix plugins of the decode profile) is at least ``threshold_tokens``;
    otherwise the decode (or aggregated) instance computes the prompt itself."""

    def __init__(self, name: str, params: PDDeciderParams, env: PluginEnv) -> None:
        self.name = name
        self.threshold = params.threshold_tokens

    def disaggregate(self, ctx: CycleContext, request: RequestView, decode: Choice) -> bool:
        if decode.endpoint.role == "worker":
            return False
        cached = ctx.cached_tokens.get(decode.endpoint.instance_id, 0)
        return request.prompt_tokens - cached >= self.threshold
