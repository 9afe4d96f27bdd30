"""What the simulator records per request and per run (plain data)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from services.common.routing.types import Choice, EndpointView, Pick, RequestView

__all__ = ["Diag", "SimRequest", "lean_pick"]


@dataclass(slots=True)
class SimRequest:
    """One replayed request. Times in ms of modelled time from the first arrival."""

    rid: str
    index: int  # position in the replay (across repetitions of the trace)
    arrival: float
    prompt: Sequence[int]  # token ids (Prompts.prompt's array; () once ended)
    out: int  # max_tokens = the trace's output length (at least 1), ignore_eos
    view: RequestView
    gateway: int = 0
    pick: Pick | None = None  # once ended, lean: ids and predictions (:func:`lean_pick`)
    first: float | None = None  # the first streamed chunk (the client's first token)
    last: float | None = None
    cached: int = 0
    prompt_tokens: int = 0
    ntok: int = 0  # tokens generated, as of its last reported output (its end: all of them)
    prefilled_at: float | None = None  # the engine's first token (end of the prefill)
    error: str | None = None  # why it failed (shed by the gateway, refused by the engine)
    endings: int = 0  # times it finished or failed (exactly 1 at the end of a run)
    attempts: int = 0  # retries on another engine after its engine failed

    @property
    def target(self) -> str:
        """The instance that computed its prompt ("" when never picked)."""
        if self.pick is None:
            return ""
        return (self.pick.prefill or self.pick.decode).endpoint.instance_id

    @property
    def home(self) -> str:
        """The instance that served its tokens, the aggregated or decode one (the session
        home the gateway reports); "" when never picked."""
        return self.pick.decode.endpoint.instance_id if self.pick is not None else ""


def lean_pick(pick: Pick, views: dict[str, EndpointView]) -> Pick:
    """``pick`` as a finished request keeps it: its predictions, and its endpoints as their
    ids, URLs and roles only (one view per instance, kept in ``views``), without the
    per-plugin scores. A run of a million requests would otherwise keep a million copies of
    the endpoints' load views and score tuples."""

    def lean(c: Choice) -> Choice:
        e = c.endpoint
        v = views.get(e.instance_id)
        if v is None:
            v = views[e.instance_id] = EndpointView(e.instance_id, e.url, e.role)
        return Choice(v, c.score)

    return replace(
        pick, decode=lean(pick.decode), prefill=None if pick.prefill is None else lean(pick.prefill)
    )


@dataclass
class Diag:
    """Routing diagnostics and engine-step totals of one simulated run."""

    picks: int = 0
    with_prefix: int = 0  # some instance had a routed-prefix match
    kept_best: int = 0  # ... and the pick went to an instance with the longest match
    lost_blocks: int = 0  # matched blocks given up (best - chosen), summed
    best_blocks: int = 0  # longest routed-prefix match per pick, summed
    predicted_cached: int = 0  # Pick.predicted_cached_tokens, summed
    disaggregated: int = 0
    reasons: dict[str, int] = field(default_factory=dict)
    # engine steps (aggregated/decode engines): count, ms, and those carrying prefill chunks
    steps: int = 0
    step_ms: float = 0.0
    mixed_steps: int = 0
    mixed_ms: float = 0.0
    decode_seqs: int = 0  # decoding sequences summed over steps (mean batch = / steps)
    held_ms: float = 0.0  # total time picks waited in the gateways' dispatch shapers
