"""What an engine kind hands its chat template besides the messages as sent (pure).

A template sees ``messages`` and ``tools`` after the engine's own request parsing, and a
template that renders them (``tools | tojson``, a tool call's ``arguments``) renders that
parsed form. To produce the engine's token ids the gateway applies the same rules:

- ``vllm`` (0.32, ``vllm/renderers``): each tool is the request's tool through
  vLLM's pydantic model, ``{"type": "function", "function": {"name", "description",
  "parameters"}}`` with absent fields as ``null``, ``strict``/``defer_loading`` only when set,
  and unknown fields dropped; an assistant message's tool calls have their ``arguments`` as
  an object (a JSON string is parsed; invalid JSON or a non-object becomes ``{}``), and an
  empty ``tool_calls`` list is dropped.
- ``sglang`` and ``tideserve``: the request's tools and messages as sent.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from services.common.tokens.chat import ChatMessage
from services.common.tokens.hashing import HashScheme

__all__ = ["adds_special_tokens", "engine_chat_inputs"]


def adds_special_tokens(scheme: HashScheme, api: str, native: bool) -> bool:
    """Whether engine kind ``scheme`` tokenizes a rendered chat template of client API
    ``api`` with the tokenizer's special tokens added on top of the template's (``native``:
    the engine serves that API itself). vLLM 0.32's own ``/v1/responses`` does (its
    tokenize parameters keep ``add_special_tokens=True``, while chat completions default to
    False): a model whose tokenizer adds a BOS gets two, so its blocks differ from the
    equivalent chat request's from the first block on."""
    return native and scheme == "vllm" and api == "responses"


def engine_chat_inputs(
    scheme: HashScheme, messages: list[ChatMessage], tools: Any
) -> tuple[list[ChatMessage], list[dict[str, Any]] | None]:
    """``(messages, tools)`` as engine kind ``scheme`` gives them to its chat template;
    ``tools`` is None when the request has none (or they are not a list)."""
    tool_list = tools if isinstance(tools, list) and tools else None
    if scheme != "vllm":
        return messages, tool_list
    vtools = [_vllm_tool(t) for t in tool_list] if tool_list is not None else None
    return [_vllm_message(m) for m in messages], vtools


def _vllm_tool(tool: Any) -> dict[str, Any]:
    f = tool.get("function") if isinstance(tool, Mapping) else None
    f = f if isinstance(f, Mapping) else {}
    out: dict[str, Any] = {
        "name": f.get("name"),
        "description": f.get("description"),
        "parameters": f.get("parameters"),
    }
    for key in ("strict", "defer_loading"):
        if f.get(key) is not None:
            out[key] = f[key]
    return {"type": "function", "function": out}


def _vllm_message(m: ChatMessage) -> ChatMessage:
    calls = m.get("tool_calls")
    if m.get("role") != "assistant" or not isinstance(calls, list):
        return m
    if not calls:
        return {k: v for k, v in m.items() if k != "tool_calls"}
    return {**m, "tool_calls": [_vllm_call(c) for c in calls]}


def _vllm_call(call: Any) -> Any:
    if not isinstance(call, Mapping) or not isinstance(call.get("function"), Mapping):
        return call
    fn = dict(call["function"])
    args = fn.get("arguments")
    if not args:
        fn["arguments"] = {}
    elif isinstance(args, str):
        try:
            parsed = json.loads(args)
        except json.JSONDecodeError:
            parsed = {}
        fn["arguments"] = parsed if isinstance(parsed, dict) else {}
    elif not isinstance(args, dict):
        fn["arguments"] = {}
    return {**call, "function": fn}
