"""The gateway request span's attributes (pure): OpenTelemetry GenAI semantic conventions
where they exist, ``tideserve.*`` for the routing decision and the agent's tool calls.

GenAI (semantic conventions, development status; names checked against the spec):

| attribute | from |
|---|---|
| ``gen_ai.operation.name`` | the route: ``chat``, ``text_completion``, ``generate_content`` |
| ``gen_ai.request.model`` | the request's ``model`` |
| ``gen_ai.conversation.id`` | the session id (``X-Tideserve-Session`` / ``session_id``) |
| ``gen_ai.usage.input_tokens``, ``.output_tokens``, ``.cache_read.input_tokens`` | the engine's usage |
| ``gen_ai.server.time_to_first_token`` | arrival → first byte to the client, seconds |
| ``gen_ai.server.time_per_output_token`` | streamed answers: mean after the first, seconds |

The spec defines the last two as histogram *metrics* (unit ``s``), not span attributes; they
are carried on the span under the same names and units so that a collector can derive the
metrics from spans. Usage attributes are set only when the engine reported usage, timing ones
only for a 200 answer whose first byte reached the client.

``tideserve.*``: ``request_id``, ``slo_class``, ``tenant``, ``profile``, ``decode_instance``
and ``prefill_instance`` (the chosen engines), ``disaggregated``, ``predicted_cached_tokens``,
``predicted_ttft_ms``, ``retries``, ``queue_ms``, ``score.<plugin>`` for the
:data:`TOP_SCORES` plugins that weighed most in the decode pick (score * weight), and
``tools_offered``, ``tool_calls`` / ``tool_results`` (tool names, in order).
"""

from __future__ import annotations

from collections.abc import Sequence

from services.scheduler.core.records import RequestContext, tpot_ms

__all__ = ["TOP_SCORES", "operation_name", "span_attributes"]

TOP_SCORES = 3

AttributeValue = str | bool | int | float | Sequence[str]

_OPERATIONS = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "text_completion",
    "/generate": "generate_content",
}


def operation_name(path: str) -> str:
    return _OPERATIONS.get(path, "")


def span_attributes(t: RequestContext, *, status: int, finish: float) -> dict[str, AttributeValue]:
    """The attributes of a finished request's gateway span (call once the answer is
    complete; reads the context's parsed answer)."""
    out: dict[str, AttributeValue] = {"tideserve.request_id": t.request_id}
    if op := operation_name(t.path):
        out["gen_ai.operation.name"] = op
    p = t.parsed
    if p is not None:
        if p.model:
            out["gen_ai.request.model"] = p.model
        if p.session_id:
            out["gen_ai.conversation.id"] = p.session_id
        out["tideserve.slo_class"] = p.slo_class
        out["tideserve.tenant"] = p.tenant
        if p.tools_offered:
            out["tideserve.tools_offered"] = p.tools_offered
        if p.tool_results:
            out["tideserve.tool_results"] = [r.name for r in p.tool_results]
    answer = t.answer()
    u = answer.usage
    if u is not None:
        out["gen_ai.usage.input_tokens"] = u.prompt_tokens
        out["gen_ai.usage.output_tokens"] = u.completion_tokens
        out["gen_ai.usage.cache_read.input_tokens"] = u.cached_tokens
    if answer.tool_calls:
        out["tideserve.tool_calls"] = [c.name for c in answer.tool_calls]
    if status == 200 and t.first_byte is not None:
        out["gen_ai.server.time_to_first_token"] = max(0.0, t.first_byte - t.arrival)
        tpot = tpot_ms(t, finish, u.completion_tokens if u is not None else 0)
        if tpot > 0:
            out["gen_ai.server.time_per_output_token"] = tpot / 1000.0
    if t.parsed_at is not None and t.admitted_at is not None:
        out["tideserve.queue_ms"] = max(0.0, (t.admitted_at - t.parsed_at) * 1000.0)
    d = t.pick
    if d is not None:
        out["tideserve.profile"] = d.profile
        out["tideserve.decode_instance"] = d.decode.endpoint.instance_id
        out["tideserve.disaggregated"] = d.prefill is not None
        if d.prefill is not None:
            out["tideserve.prefill_instance"] = d.prefill.endpoint.instance_id
        out["tideserve.predicted_cached_tokens"] = d.predicted_cached_tokens
        out["tideserve.predicted_ttft_ms"] = d.predicted_ttft_ms
        out["tideserve.retries"] = t.retries
        top = sorted(d.decode.scores, key=lambda s: s[1] * s[2], reverse=True)[:TOP_SCORES]
        for name, score, _weight in top:
            out[f"tideserve.score.{name}"] = score
    return out
