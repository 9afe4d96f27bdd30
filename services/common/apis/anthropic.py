"""The Anthropic Messages API over OpenAI chat completions (pure).

One canonical form: every Messages request becomes an OpenAI chat-completions body
(:func:`to_chat`), which the one tokenization path renders
(:meth:`services.common.tokens.TokenPath.encode_chat`), so a Messages request and the
equivalent chat request have the same prompt ids and block hashes. Answers go back the
other way: a whole chat answer with :func:`~.anthropic_answer.to_message`, a chat SSE stream with
:class:`services.common.apis.anthropic_stream.StreamTranslator`.

Request mapping:

| Messages | chat completions |
|---|---|
| ``system`` (string or text blocks) | a first ``system`` message |
| ``text`` block | text content (a string stays a string; blocks become text parts) |
| ``tool_use`` block (assistant) | ``tool_calls`` entry (``input`` JSON-encoded) |
| ``tool_result`` block (user) | a ``tool`` message (``tool_call_id``), before the turn's text |
| ``thinking`` / ``redacted_thinking`` (assistant) | dropped (not rendered again) |
| ``image``, ``document``, other blocks | 400: text-only serving |
| ``tools`` (``name``, ``description``, ``input_schema``) | ``tools`` in function form |
| ``tool_choice`` auto / any / tool / none | ``auto`` / ``required`` / named function / ``none`` |
| ``disable_parallel_tool_use`` | ``parallel_tool_calls: false`` |
| ``stop_sequences``, ``temperature``, ``top_p``, ``top_k``, ``max_tokens`` | ``stop``, same |
| ``stream`` | ``stream`` with ``stream_options.include_usage`` |
| ``metadata.user_id`` | not forwarded (a session id: :attr:`ChatForm.user_id`) |
| ``cache_salt`` (vLLM's extension, not Anthropic's) | ``cache_salt`` |

``tool_result.is_error`` is validated and not rendered (a chat ``tool`` message has no error
flag; vLLM's own Messages endpoint drops it too). ``thinking`` (the request option) and
``service_tier`` are accepted and ignored. ``cache_control`` marks are prefix hints:
:attr:`ChatForm.stable_prefix` holds the canonical messages up to the last one.

Answer mapping: finish reason ``stop`` → ``end_turn`` (``stop_sequence`` with the matched
string when the engine names one of the request's ``stop_sequences`` in ``stop_reason``, as
vLLM does), ``length`` → ``max_tokens``, ``tool_calls`` → ``tool_use``,
``content_filter`` → ``refusal``. Usage: ``input_tokens`` = prompt tokens not read from the
cache, ``cache_read_input_tokens`` = the engine's ``prompt_tokens_details.cached_tokens``,
``output_tokens`` = completion tokens.

Errors are :class:`MessagesError` (400 unless said otherwise); :func:`error_body` is
Anthropic's error shape and :func:`error_type` its type for an HTTP status.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ChatForm",
    "MessagesError",
    "error_body",
    "error_type",
    "from_openai_error",
    "to_chat",
]

# HTTP status → Anthropic error type (other 4xx: invalid_request_error, other 5xx: api_error).
_TYPES: dict[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    502: "api_error",
    503: "overloaded_error",
    504: "api_error",
    529: "overloaded_error",
}
_IGNORED = frozenset({"thinking", "service_tier", "anthropic_version"})
_UNSUPPORTED = frozenset({"mcp_servers", "container"})
_TOOL_CHOICE = {"auto": "auto", "any": "required", "none": "none"}


class MessagesError(ValueError):
    """A request the Messages API refuses: ``status`` and ``param`` (the field)."""

    def __init__(self, message: str, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.message, self.param, self.status = message, param, status


def error_type(status: int) -> str:
    if status in _TYPES:
        return _TYPES[status]
    return "api_error" if status >= 500 else "invalid_request_error"


def error_body(status: int, message: str) -> dict[str, Any]:
    """Anthropic's error shape for ``status``."""
    return {"type": "error", "error": {"type": error_type(status), "message": message}}


def from_openai_error(status: int, body: bytes) -> dict[str, Any]:
    """An error answer (OpenAI-shaped, Anthropic-shaped or not JSON) in Anthropic's shape."""
    try:
        obj = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        obj = None
    if isinstance(obj, dict) and obj.get("type") == "error" and isinstance(obj.get("error"), dict):
        return obj
    err = obj.get("error") if isinstance(obj, dict) else None
    if isinstance(err, dict) and isinstance(err.get("message"), str):
        return error_body(status, err["message"])
    if isinstance(err, str):
        return error_body(status, err)
    text = body[:300].decode(errors="replace").strip()
    return error_body(status, text or f"upstream answered HTTP {status}")


@dataclass(frozen=True, slots=True)
class ChatForm:
    """A Messages request as the canonical chat body. ``stable_prefix``: the canonical
    messages up to the end of the last ``cache_control`` block (None: no mark; ``[]``: a
    mark on the tools only); ``user_id``: ``metadata.user_id`` ("" when absent)."""

    body: dict[str, Any]
    stable_prefix: list[dict[str, Any]] | None = None
    user_id: str = ""


def _bad(message: str, param: str | None = None) -> MessagesError:
    return MessagesError(message, param)


def _number(body: Mapping[str, Any], key: str) -> float | None:
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise _bad(f"{key}: must be a number", key)
    return v


def _text_blocks(blocks: Any, where: str) -> list[dict[str, Any]]:
    """Text blocks (``system``, ``tool_result.content``) as chat text parts."""
    if not isinstance(blocks, list):
        raise _bad(f"{where}: must be a string or a list of text blocks", where)
    out = []
    for i, b in enumerate(blocks):
        kind = b.get("type") if isinstance(b, Mapping) else None
        if kind != "text":
            if kind in ("image", "document"):
                raise _bad(f"{where}.{i}: {kind} blocks are not supported (text-only serving)")
            raise _bad(f"{where}.{i}: expected a text block, got type {kind!r}", where)
        if not isinstance(b.get("text"), str):
            raise _bad(f"{where}.{i}.text: must be a string", where)
        out.append({"type": "text", "text": b["text"]})
    return out


def _marked(block: Any) -> bool:
    return isinstance(block, Mapping) and block.get("cache_control") is not None


def _system(body: Mapping[str, Any]) -> tuple[list[dict[str, Any]], bool]:
    """The system message (or none) and whether it carries a cache mark."""
    s = body.get("system")
    if s is None or s == "" or s == []:
        return [], False
    if isinstance(s, str):
        return [{"role": "system", "content": s}], False
    parts = _text_blocks(s, "system")
    return [{"role": "system", "content": parts}], any(_marked(b) for b in s)


def _tool_result(b: Mapping[str, Any], where: str) -> dict[str, Any]:
    tid = b.get("tool_use_id")
    if not isinstance(tid, str) or not tid:
        raise _bad(f"{where}.tool_use_id: must be a non-empty string", "tool_use_id")
    if b.get("is_error") is not None and not isinstance(b.get("is_error"), bool):
        raise _bad(f"{where}.is_error: must be a boolean", "is_error")
    c = b.get("content")
    if c is None:
        content: str | list[dict[str, Any]] = ""
    elif isinstance(c, str):
        content = c
    else:
        content = _text_blocks(c, f"{where}.content")
    return {"role": "tool", "tool_call_id": tid, "content": content}


def _user(content: list[Any], where: str, out: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """Append a user turn's tool messages, then its text as one user message; return the
    canonical messages up to the turn's last cache mark (None: no mark)."""
    tools: list[dict[str, Any]] = []
    texts: list[dict[str, Any]] = []
    mark: tuple[int, int] | None = None
    for j, b in enumerate(content):
        kind = b.get("type") if isinstance(b, Mapping) else None
        at = f"{where}.content.{j}"
        if kind == "text":
            if not isinstance(b.get("text"), str):
                raise _bad(f"{at}.text: must be a string", "messages")
            texts.append({"type": "text", "text": b["text"]})
        elif kind == "tool_result":
            tools.append(_tool_result(b, at))
        elif kind in ("image", "document"):
            raise _bad(f"{at}: {kind} blocks are not supported (text-only serving)", "messages")
        else:
            raise _bad(f"{at}: unsupported content block type {kind!r} in a user message")
        if _marked(b):
            mark = (len(tools), len(texts))
    base = len(out)
    out.extend(tools)
    if texts:
        out.append({"role": "user", "content": texts})
    if mark is None:
        return None
    if mark == (len(tools), len(texts)):
        return list(out)  # the whole turn (the same message objects)
    prefix = out[:base] + tools[: mark[0]]
    if mark[1]:
        prefix.append({"role": "user", "content": texts[: mark[1]]})
    return prefix


def _tool_call(b: Mapping[str, Any], at: str) -> dict[str, Any]:
    tid, name, args = b.get("id"), b.get("name"), b.get("input", {})
    if not isinstance(tid, str) or not tid:
        raise _bad(f"{at}.id: must be a non-empty string", "messages")
    if not isinstance(name, str) or not name:
        raise _bad(f"{at}.name: must be a non-empty string", "messages")
    if not isinstance(args, dict):
        raise _bad(f"{at}.input: must be an object", "messages")
    fn = {"name": name, "arguments": json.dumps(args)}
    return {"id": tid, "type": "function", "function": fn}


def _assistant(content: list[Any], where: str) -> tuple[dict[str, Any], bool]:
    texts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    marked = False
    for j, b in enumerate(content):
        kind = b.get("type") if isinstance(b, Mapping) else None
        at = f"{where}.content.{j}"
        if kind == "text":
            if not isinstance(b.get("text"), str):
                raise _bad(f"{at}.text: must be a string", "messages")
            texts.append({"type": "text", "text": b["text"]})
        elif kind == "tool_use":
            calls.append(_tool_call(b, at))
        elif kind in ("thinking", "redacted_thinking"):
            continue
        else:
            raise _bad(f"{at}: unsupported content block type {kind!r} in an assistant message")
        marked = marked or _marked(b)
    msg: dict[str, Any] = {"role": "assistant", "content": texts or None}
    if calls:
        msg["tool_calls"] = calls
    return msg, marked


def _messages(body: Mapping[str, Any], out: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """Append the canonical messages; the prefix up to the last cache mark (or None)."""
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise _bad("messages: must be a non-empty list", "messages")
    prefix: list[dict[str, Any]] | None = None
    for i, m in enumerate(msgs):
        where = f"messages.{i}"
        if not isinstance(m, Mapping):
            raise _bad(f"{where}: must be an object", "messages")
        role, content = m.get("role"), m.get("content")
        if role not in ("user", "assistant"):
            raise _bad(f"{where}.role: must be 'user' or 'assistant', got {role!r}", "messages")
        if isinstance(content, str):
            out.append({"role": role, "content": content})
            continue
        if not isinstance(content, list):
            raise _bad(f"{where}.content: must be a string or a list of blocks", "messages")
        if role == "user":
            p = _user(content, where, out)
            prefix = p if p is not None else prefix
        else:
            msg, marked = _assistant(content, where)
            out.append(msg)
            prefix = list(out) if marked else prefix
    return prefix


def _tools(body: Mapping[str, Any]) -> tuple[list[dict[str, Any]] | None, bool]:
    tools = body.get("tools")
    if tools is None:
        return None, False
    if not isinstance(tools, list):
        raise _bad("tools: must be a list", "tools")
    out = []
    for i, t in enumerate(tools):
        if not isinstance(t, Mapping):
            raise _bad(f"tools.{i}: must be an object", "tools")
        if t.get("type") not in (None, "custom"):
            raise _bad(f"tools.{i}: server tools ({t.get('type')!r}) are not supported", "tools")
        name, desc, schema = t.get("name"), t.get("description"), t.get("input_schema")
        if not isinstance(name, str) or not name:
            raise _bad(f"tools.{i}.name: must be a non-empty string", "tools")
        if desc is not None and not isinstance(desc, str):
            raise _bad(f"tools.{i}.description: must be a string", "tools")
        if not isinstance(schema, dict):
            raise _bad(f"tools.{i}.input_schema: must be an object", "tools")
        fn: dict[str, Any] = {"name": name, "parameters": schema}
        if desc is not None:
            fn["description"] = desc
        out.append({"type": "function", "function": fn})
    return out, any(_marked(t) for t in tools)


def _tool_choice(body: Mapping[str, Any], chat: dict[str, Any]) -> None:
    tc = body.get("tool_choice")
    if tc is None:
        return
    kind = tc.get("type") if isinstance(tc, Mapping) else None
    if kind == "tool":
        if not isinstance(tc.get("name"), str) or not tc["name"]:
            raise _bad("tool_choice.name: must be a non-empty string", "tool_choice")
        chat["tool_choice"] = {"type": "function", "function": {"name": tc["name"]}}
    elif isinstance(kind, str) and kind in _TOOL_CHOICE:
        chat["tool_choice"] = _TOOL_CHOICE[kind]
    else:
        raise _bad("tool_choice.type: must be one of auto, any, tool, none", "tool_choice")
    dis = tc.get("disable_parallel_tool_use")
    if dis is not None and not isinstance(dis, bool):
        raise _bad("tool_choice.disable_parallel_tool_use: must be a boolean", "tool_choice")
    if dis:
        chat["parallel_tool_calls"] = False


def _sampling(body: Mapping[str, Any], chat: dict[str, Any], need_max: bool) -> None:
    mt = body.get("max_tokens")
    if mt is None and need_max:
        raise _bad("max_tokens: Field required", "max_tokens")
    if mt is not None:
        if isinstance(mt, bool) or not isinstance(mt, int) or mt < 1:
            raise _bad("max_tokens: must be a positive integer", "max_tokens")
        chat["max_tokens"] = mt
    for key in ("temperature", "top_p"):
        v = _number(body, key)
        if v is not None:
            chat[key] = v
    top_k = body.get("top_k")
    if top_k is not None:
        if isinstance(top_k, bool) or not isinstance(top_k, int):
            raise _bad("top_k: must be an integer", "top_k")
        chat["top_k"] = top_k
    stops = body.get("stop_sequences")
    if stops is not None:
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            raise _bad("stop_sequences: must be a list of strings", "stop_sequences")
        if stops:
            chat["stop"] = list(stops)
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise _bad("stream: must be a boolean", "stream")
    if stream:
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}


def _user_id(body: Mapping[str, Any]) -> str:
    meta = body.get("metadata")
    if meta is None:
        return ""
    if not isinstance(meta, Mapping):
        raise _bad("metadata: must be an object", "metadata")
    uid = meta.get("user_id")
    if uid is not None and not isinstance(uid, str):
        raise _bad("metadata.user_id: must be a string", "metadata")
    return uid or ""


def to_chat(body: Any, *, need_max_tokens: bool = True) -> ChatForm:
    """The canonical chat body of a Messages request (``need_max_tokens=False``: a
    ``count_tokens`` body). Raises :class:`MessagesError`."""
    if not isinstance(body, Mapping):
        raise _bad("the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _bad("model: Field required (a non-empty string)", "model")
    for key in _UNSUPPORTED:
        if body.get(key) is not None:
            raise _bad(f"{key}: not supported by this server", key)
    messages, sys_marked = _system(body)
    prefix = _messages(body, messages)
    tools, tools_marked = _tools(body)
    if prefix is None and sys_marked:
        prefix = messages[:1]
    if prefix is None and tools_marked:
        prefix = []
    chat: dict[str, Any] = {"model": model, "messages": messages}
    if tools is not None:
        chat["tools"] = tools
    _tool_choice(body, chat)
    _sampling(body, chat, need_max_tokens)
    salt = body.get("cache_salt")
    if salt is not None:
        if not isinstance(salt, str):
            raise _bad("cache_salt: must be a string", "cache_salt")
        chat["cache_salt"] = salt
    return ChatForm(chat, prefix, _user_id(body))


# -- answers ------------------------------------------------------------------------------
