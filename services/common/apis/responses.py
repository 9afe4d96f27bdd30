"""The OpenAI Responses API as the canonical chat-completions form, and back (pure).

Request (:func:`parse_responses`, then :func:`chat_body`): ``input`` is a string (one user
message) or a list of items:

- ``message`` items (``type`` may be left out) with role ``user``, ``assistant``,
  ``system`` or ``developer`` (rendered as ``system``: chat templates know that one), and
  content a string or ``input_text`` / ``output_text`` parts; an image, file or audio part
  is a 400 (Tideserve serves text only);
- ``function_call`` items (``call_id``, ``name``, ``arguments``): ``tool_calls`` of the
  assistant message they follow (a new assistant message when none is open);
- ``function_call_output`` items (``call_id``, ``output``): ``tool`` messages;
- ``reasoning`` items: kept in the stored turn, not rendered (chat has no place for them).

``instructions`` become a first ``system`` message (not carried to later turns, as OpenAI
does with ``previous_response_id``), ``tools`` of type ``function`` (flat Responses form)
the chat form, ``tool_choice`` likewise, ``max_output_tokens`` ``max_tokens``,
``text.format`` (JSON object / schema) ``response_format``, ``reasoning.effort``
``reasoning_effort``;
``temperature``, ``top_p``, ``parallel_tool_calls``, ``stream`` and the gateway's own fields
(``slo_class``, ``tenant``, ``session_id``, ``cache_salt``, ``prompt_cache_key``) carry over.

Answer (:mod:`.responses_answer`): :func:`~.responses_answer.response_object` turns a chat completion into a ``response`` object
(``output``: a ``message`` item with ``output_text``, then ``function_call`` items;
``usage`` with ``input_tokens_details.cached_tokens``); status ``incomplete`` (reason
``max_output_tokens``) when the chat answer stopped on length, as OpenAI reports it.
Streams: :mod:`.responses_stream`.

Every problem raises :class:`ResponsesError` (HTTP 400, OpenAI error fields).
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any, NamedTuple

__all__ = [
    "CARRIED",
    "ResponsesError",
    "ResponsesRequest",
    "as_map",
    "chat_body",
    "chat_messages_of",
    "native_body",
    "new_response_id",
    "parse_responses",
]

Item = dict[str, Any]

CARRIED = ("slo_class", "tenant", "session_id", "cache_salt", "prompt_cache_key", "user")
"""Body fields passed on to the canonical chat body unchanged."""

_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
_TEXT_PARTS = ("input_text", "output_text", "text")
_UNSUPPORTED = ("background", "conversation")


class ResponsesError(ValueError):
    """A bad Responses request: ``param`` and ``code`` as in an OpenAI error body."""

    def __init__(self, message: str, param: str | None = None, code: str = "invalid_value"):
        super().__init__(message)
        self.message, self.param, self.code = message, param, code


class ResponsesRequest(NamedTuple):
    """A validated request: ``items`` are this turn's input items, normalized (each a
    ``message``, ``function_call``, ``function_call_output`` or ``reasoning`` item with
    text content parts); ``store`` None when the client left it out. (A named tuple:
    immutable, and built in a tenth of a frozen dataclass's time on every request; its
    dicts are not to be changed.)"""

    model: str
    items: tuple[Item, ...]
    instructions: str | None = None
    tools: tuple[Item, ...] = ()
    tool_choice: Any = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    parallel_tool_calls: bool | None = None
    text_format: dict[str, Any] | None = None
    """``text.format`` when not plain text (``json_object`` / ``json_schema``)."""
    reasoning_effort: str | None = None
    stream: bool = False
    store: bool | None = None
    previous_response_id: str | None = None
    metadata: Mapping[str, str] = MappingProxyType({})
    carried: Mapping[str, Any] = MappingProxyType({})


def as_map(v: Any) -> Mapping[str, Any]:
    """``v`` when it is an object, else an empty one."""
    return v if isinstance(v, Mapping) else {}


def new_response_id() -> str:
    return "resp_" + secrets.token_hex(24)


def _typed(body: Mapping[str, Any], key: str, types: tuple[type, ...], what: str) -> Any:
    v = body.get(key)
    if v is None:
        return None
    if (isinstance(v, bool) and bool not in types) or not isinstance(v, types):
        raise ResponsesError(f"'{key}' must be {what}", key, "invalid_type")
    return v


def _text_of(content: Any, where: str, output: bool = False) -> list[Item]:
    """Content (a string or parts) as normalized text parts."""
    kind = "output_text" if output else "input_text"
    if isinstance(content, str):
        return [{"type": kind, "text": content}]
    if not isinstance(content, list):
        raise ResponsesError(f"{where}.content must be a string or a list", "input", "invalid_type")
    parts = []
    for j, p in enumerate(content):
        t = p.get("type") if isinstance(p, Mapping) else None
        if t not in _TEXT_PARTS:
            raise ResponsesError(
                f"{where}.content[{j}] has type {t!r}: only input_text and output_text parts "
                "are supported (Tideserve serves text only)",
                "input",
                "unsupported_content",
            )
        if not isinstance(p.get("text"), str):
            raise ResponsesError(
                f"{where}.content[{j}].text must be a string", "input", "invalid_type"
            )
        parts.append(
            {"type": "output_text" if t == "output_text" else "input_text", "text": p["text"]}
        )
    return parts


def _str_of(item: Mapping[str, Any], key: str, where: str) -> str:
    v = item.get(key)
    if not isinstance(v, str):
        raise ResponsesError(f"{where}.{key} must be a string", "input", "invalid_type")
    return v


def _item(raw: Any, i: int) -> Item:
    where = f"input[{i}]"
    if not isinstance(raw, Mapping):
        raise ResponsesError(f"{where} must be an object", "input", "invalid_type")
    t = raw.get("type", "message")
    if t == "message":
        role = raw.get("role")
        if role not in _ROLES:
            raise ResponsesError(
                f"{where}.role must be one of user, assistant, system, developer; got {role!r}",
                "input",
            )
        return {
            "type": "message",
            "role": role,
            "content": _text_of(raw.get("content"), where, role == "assistant"),
        }
    if t == "function_call":
        out = {k: _str_of(raw, k, where) for k in ("call_id", "name", "arguments")}
        return {"type": "function_call", **out}
    if t == "function_call_output":
        output = raw.get("output")
        if isinstance(output, list):
            output = "".join(p["text"] for p in _text_of(output, where))
        if not isinstance(output, str):
            raise ResponsesError(f"{where}.output must be a string", "input", "invalid_type")
        return {
            "type": "function_call_output",
            "call_id": _str_of(raw, "call_id", where),
            "output": output,
        }
    if t == "reasoning":
        return dict(raw)
    raise ResponsesError(f"{where} has type {t!r}: not supported", "input", "unsupported_item")


def _items(raw: Any) -> tuple[Item, ...]:
    if isinstance(raw, str):
        return (
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": raw}]},
        )
    if not isinstance(raw, list):
        raise ResponsesError("'input' must be a string or a list of items", "input", "invalid_type")
    return tuple(_item(x, i) for i, x in enumerate(raw))


def _tool(raw: Any, i: int) -> Item:
    if not isinstance(raw, Mapping) or raw.get("type") != "function":
        t = raw.get("type") if isinstance(raw, Mapping) else None
        raise ResponsesError(
            f"tools[{i}] has type {t!r}: only function tools are supported",
            "tools",
            "unsupported_tool",
        )
    if not isinstance(raw.get("name"), str) or not raw["name"]:
        raise ResponsesError(f"tools[{i}].name must be a non-empty string", "tools", "invalid_type")
    params = raw.get("parameters")
    if params is not None and not isinstance(params, Mapping):
        raise ResponsesError(f"tools[{i}].parameters must be an object", "tools", "invalid_type")
    keep = ("type", "name", "description", "parameters", "strict")
    return {k: raw[k] for k in keep if raw.get(k) is not None}


def _tool_choice(raw: Any) -> Any:
    if raw is None or raw in ("auto", "none", "required"):
        return raw
    if (
        isinstance(raw, Mapping)
        and raw.get("type") == "function"
        and isinstance(raw.get("name"), str)
    ):
        return {"type": "function", "name": raw["name"]}
    raise ResponsesError("'tool_choice' must be auto, none, required or a function", "tool_choice")


def _metadata(raw: Any) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping) or not all(isinstance(v, str) for v in raw.values()):
        raise ResponsesError("'metadata' must be an object of strings", "metadata", "invalid_type")
    if len(raw) > 16:
        raise ResponsesError("'metadata' holds at most 16 keys", "metadata")
    return {str(k): v for k, v in raw.items()}


def _text_format(raw: Any) -> dict[str, Any] | None:
    """``text.format``: None for plain text; json_object / json_schema (with a ``schema``
    object) as given; anything else is a 400."""
    fmt = as_map(raw).get("format") if raw is not None else None
    if raw is not None and not isinstance(raw, Mapping):
        raise ResponsesError("'text' must be an object", "text", "invalid_type")
    if fmt is None or as_map(fmt).get("type") == "text":
        return None
    kind = as_map(fmt).get("type")
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema" and isinstance(as_map(fmt).get("schema"), Mapping):
        return dict(as_map(fmt))
    raise ResponsesError(
        "'text.format' must be text, json_object or json_schema with a schema", "text.format"
    )


def parse_responses(body: Any) -> ResponsesRequest:
    """Validate a Responses request body (see the module doc). Raises ResponsesError.
    (Fields checked in a fixed order, so a body with several problems gets the same error
    every time; a field left out is not looked at twice.)"""
    if not isinstance(body, Mapping):
        raise ResponsesError("the request body must be a JSON object", None, "invalid_body")
    get = body.get
    model = _typed(body, "model", (str,), "a string")
    if not model:
        raise ResponsesError("'model' is required", "model", "missing")
    for key in _UNSUPPORTED:
        if get(key):
            raise ResponsesError(
                f"'{key}' is not supported by this gateway", key, "unsupported_parameter"
            )
    if get("input") is None:
        raise ResponsesError("'input' is required", "input", "missing")
    tools = _typed(body, "tools", (list,), "a list") if "tools" in body else None
    mot = (
        _typed(body, "max_output_tokens", (int,), "an integer")
        if "max_output_tokens" in body
        else None
    )
    if mot is not None and mot < 1:
        raise ResponsesError(
            f"'max_output_tokens' must be at least 1, got {mot}", "max_output_tokens"
        )
    prev = (
        _typed(body, "previous_response_id", (str,), "a string")
        if "previous_response_id" in body
        else None
    )
    items = _items(get("input"))
    instructions = (
        _typed(body, "instructions", (str,), "a string") if "instructions" in body else None
    )
    tools = tuple(_tool(t, i) for i, t in enumerate(tools)) if tools else ()
    choice = get("tool_choice")
    return ResponsesRequest(  # keywords in the order their checks run
        model=model,
        items=items,
        instructions=instructions,
        tools=tools,
        tool_choice=None if choice is None else _tool_choice(choice),
        max_output_tokens=mot,
        temperature=_typed(body, "temperature", _NUMBER, "a number")
        if "temperature" in body
        else None,
        top_p=_typed(body, "top_p", _NUMBER, "a number") if "top_p" in body else None,
        parallel_tool_calls=_typed(body, "parallel_tool_calls", _BOOL, "a boolean")
        if "parallel_tool_calls" in body
        else None,
        stream=bool(_typed(body, "stream", _BOOL, "a boolean")) if "stream" in body else False,
        store=_typed(body, "store", _BOOL, "a boolean") if "store" in body else None,
        previous_response_id=prev or None,
        metadata=_metadata(get("metadata")),
        carried={k: body[k] for k in CARRIED if get(k) is not None},
        text_format=_text_format(get("text")) if "text" in body else None,
        reasoning_effort=_typed(as_map(get("reasoning")), "effort", (str,), "a string")
        if "reasoning" in body
        else None,
    )


_NUMBER = (int, float)
_BOOL = (bool,)


def _chat_content(parts: Sequence[Item]) -> str | list[Item]:
    if len(parts) == 1:
        return str(parts[0]["text"])
    return [{"type": "text", "text": p["text"]} for p in parts]


def chat_messages_of(items: Sequence[Item]) -> list[Item]:
    """Chat messages of normalized items (function calls join the assistant message they
    follow; reasoning items are not rendered)."""
    out: list[Item] = []
    for it in items:
        t = it["type"]
        if t == "message":
            out.append({"role": _ROLES[it["role"]], "content": _chat_content(it["content"])})
        elif t == "function_call":
            call = {
                "id": it["call_id"],
                "type": "function",
                "function": {"name": it["name"], "arguments": it["arguments"]},
            }
            last = out[-1] if out else None
            if last is None or last["role"] != "assistant":
                last = {"role": "assistant", "content": None}
                out.append(last)
            last.setdefault("tool_calls", []).append(call)
        elif t == "function_call_output":
            out.append({"role": "tool", "tool_call_id": it["call_id"], "content": it["output"]})
    return out


def chat_body(req: ResponsesRequest, history: Sequence[Item] = ()) -> dict[str, Any]:
    """The canonical chat-completions body of ``req`` after the ``history`` items of its
    stored chain (``previous_response_id``; empty for a first turn)."""
    messages = [{"role": "system", "content": req.instructions}] if req.instructions else []
    messages += chat_messages_of([*history, *req.items])
    body: dict[str, Any] = {"model": req.model, "messages": messages}
    if req.tools:
        body["tools"] = [
            {"type": "function", "function": {k: v for k, v in t.items() if k != "type"}}
            for t in req.tools
        ]
    if isinstance(req.tool_choice, Mapping):
        body["tool_choice"] = {"type": "function", "function": {"name": req.tool_choice["name"]}}
    elif req.tool_choice is not None:
        body["tool_choice"] = req.tool_choice
    optional = {
        "max_tokens": req.max_output_tokens,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "parallel_tool_calls": req.parallel_tool_calls,
        "reasoning_effort": req.reasoning_effort,
        "response_format": _response_format(req.text_format),
    }
    body.update({k: v for k, v in optional.items() if v is not None})
    if req.stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    body.update(req.carried)
    return body


def _response_format(fmt: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Chat's ``response_format`` of a ``text.format``."""
    if fmt is None or fmt.get("type") == "json_object":
        return None if fmt is None else {"type": "json_object"}
    schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
    return {"type": "json_schema", "json_schema": {"name": "output", **schema}}


def native_body(
    req: ResponsesRequest, history: Sequence[Item] = (), cache_salt: str | None = None
) -> dict[str, Any]:
    """The Responses body for an engine that serves the API itself: the rebuilt context as
    ``input`` items, no ``previous_response_id`` (the engine has not got our store) and
    ``store: false``."""
    body: dict[str, Any] = {"model": req.model, "input": [*history, *req.items], "store": False}
    optional = {
        "instructions": req.instructions,
        "tools": list(req.tools) or None,
        "tool_choice": req.tool_choice,
        "max_output_tokens": req.max_output_tokens,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "parallel_tool_calls": req.parallel_tool_calls,
        "text": {"format": req.text_format} if req.text_format else None,
        "reasoning": {"effort": req.reasoning_effort} if req.reasoning_effort else None,
        "cache_salt": cache_salt,
    }
    body.update({k: v for k, v in optional.items() if v is not None})
    if req.stream:
        body["stream"] = True
    return body
