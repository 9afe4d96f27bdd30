"""Chat-completions answers in the Anthropic Messages shape (pure): a whole answer as a
message (:func:`to_message`), its stop reason (:func:`stop_of`), its usage
(:func:`chat_usage`) and tool inputs (:func:`tool_input`). Requests go the other way in
:mod:`services.common.apis.anthropic`, streams in :mod:`.anthropic_stream`."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["chat_usage", "stop_of", "to_message", "tool_input"]


def tool_input(arguments: Any) -> dict[str, Any]:
    """A chat tool call's ``arguments`` (a JSON string) as a ``tool_use.input`` object;
    arguments that are not a JSON object are kept under ``"_raw"``."""
    if isinstance(arguments, dict):
        return arguments
    if not isinstance(arguments, str) or not arguments.strip():
        return {}
    try:
        v = json.loads(arguments)
    except ValueError:
        return {"_raw": arguments}
    return v if isinstance(v, dict) else {"_raw": arguments}


def stop_of(
    finish: Any, stop_reason: Any, stop_sequences: Sequence[str], tool_calls: bool
) -> tuple[str, str | None]:
    """``(stop_reason, stop_sequence)`` of a chat finish reason (see the module doc)."""
    if finish == "tool_calls" or (tool_calls and finish in ("stop", None)):
        return "tool_use", None
    if finish == "length":
        return "max_tokens", None
    if finish == "content_filter":
        return "refusal", None
    if isinstance(stop_reason, str) and stop_reason in stop_sequences:
        return "stop_sequence", stop_reason
    return "end_turn", None


def chat_usage(usage: Any) -> dict[str, int]:
    """Anthropic usage of an OpenAI ``usage`` object (zeros when absent): the prompt split
    into tokens read from the cache (``cached_tokens``), written to it (vLLM's
    ``created_cache_tokens``) and the rest, as vLLM's own ``/v1/messages`` reports them."""
    u = usage if isinstance(usage, Mapping) else {}
    details = u.get("prompt_tokens_details")
    d = details if isinstance(details, Mapping) else {}
    prompt = _count(u.get("prompt_tokens"))
    hit = min(_count(d.get("cached_tokens")), prompt)
    written = min(_count(d.get("created_cache_tokens")), prompt - hit)
    return {
        "input_tokens": prompt - hit - written,
        "output_tokens": _count(u.get("completion_tokens")),
        "cache_read_input_tokens": hit,
        "cache_creation_input_tokens": written,
    }


def _count(v: Any) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else 0


def to_message(chat: Any, *, model: str, stop_sequences: Sequence[str] = ()) -> dict[str, Any]:
    """The Anthropic message of a whole chat-completions answer (``model``: the name the
    client asked for)."""
    obj = chat if isinstance(chat, Mapping) else {}
    choices = obj.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices else {}
    choice = choice if isinstance(choice, Mapping) else {}
    msg = choice.get("message")
    msg = msg if isinstance(msg, Mapping) else {}
    content: list[dict[str, Any]] = []
    text = msg.get("content")
    if isinstance(text, str) and text:
        content.append({"type": "text", "text": text})
    calls = msg.get("tool_calls")
    for i, c in enumerate(calls if isinstance(calls, list) else []):
        fn = c.get("function") if isinstance(c, Mapping) else None
        fn = fn if isinstance(fn, Mapping) else {}
        tid = c.get("id") if isinstance(c, Mapping) else None
        content.append(
            {
                "type": "tool_use",
                "id": tid if isinstance(tid, str) and tid else f"toolu_{i}",
                "name": str(fn.get("name") or ""),
                "input": tool_input(fn.get("arguments")),
            }
        )
    has_calls = any(b["type"] == "tool_use" for b in content)
    reason, seq = stop_of(
        choice.get("finish_reason"), choice.get("stop_reason"), stop_sequences, has_calls
    )
    cid = obj.get("id")
    return {
        "id": f"msg_{cid}" if isinstance(cid, str) and cid else "msg_0",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": reason,
        "stop_sequence": seq,
        "usage": chat_usage(obj.get("usage")),
    }
