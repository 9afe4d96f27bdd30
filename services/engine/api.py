"""Request parsing and response shapes of the engine's HTTP API (pure).

Three entry points, one internal form (:class:`GenRequest`):

* ``POST /generate`` (SGLang native): ``text`` or ``input_ids``, ``sampling_params``
  (``max_new_tokens``, ``ignore_eos``, ...), ``stream``, ``rid``.
* ``POST /v1/completions``: ``prompt`` (a string or a list of token ids), ``max_tokens``.
* ``POST /v1/chat/completions``: ``messages``, ``max_tokens`` / ``max_completion_tokens``.
* ``POST /v1/messages`` (Anthropic), by its canonical chat body (:func:`messages_chat`,
  :mod:`services.common.apis.anthropic`) over the chat path, the answer translated back;
  ``/v1/messages/count_tokens`` counts that body's prompt.

``POST /v1/responses`` (the OpenAI Responses API, stateless) is translated into a chat
request and its answer back (:mod:`services.common.apis.responses`; the server's
``_responses``).

Prompts are tokenized by the engine's :class:`services.common.tokens.TokenPath`, the same path
the gateway uses: by default the simulator's whitespace tokenizer and chat template
(:func:`services.common.tokens.chat_prompt`: each message becomes the line
``"<role>: <content>"``, lines joined with ``"\\n"``), or, with ``--model-path``, the model's
tokenizer and chat template. Content parts other than text are a 400.

Every request may carry ``cache_salt`` (vLLM's name; alias ``tenant``) to namespace its
prefix cache, and SGLang's disaggregation fields ``bootstrap_host``, ``bootstrap_port``,
``bootstrap_room``, and vLLM's ``kv_transfer_params`` (see :mod:`services.engine.pd_vllm`).
The simulator never emits EOS: each request generates exactly its
``max_tokens`` (finish reason ``length``).

Parse functions raise :class:`BadRequest` (→ HTTP 400 with an OpenAI-style body).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from services.common.apis.anthropic import ChatForm, MessagesError, to_chat
from services.common.dataplane.location import KVLocation
from services.common.tokens import ChatError, TokenPath, chat_prompt, render_token

__all__ = [
    "BadRequest",
    "Bootstrap",
    "GenRequest",
    "KVTransferParams",
    "chat_chunk",
    "chat_prompt",
    "chat_response",
    "completion_chunk",
    "completion_response",
    "error_body",
    "messages_chat",
    "parse_chat",
    "parse_completion",
    "parse_generate",
    "render",
    "usage",
]

Kind = Literal["generate", "completion", "chat"]


class BadRequest(ValueError):
    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


def error_body(
    message: str, etype: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": etype, "param": param, "code": code}}


@dataclass(frozen=True)
class Bootstrap:
    host: str
    port: int | None
    room: int


@dataclass(frozen=True)
class KVTransferParams:
    """vLLM's ``kv_transfer_params`` (NixlConnector field names); unknown keys are ignored."""

    do_remote_decode: bool = False
    do_remote_prefill: bool = False
    remote_engine_id: str | None = None
    remote_request_id: str | None = None
    remote_block_ids: tuple[int, ...] = ()
    remote_host: str | None = None
    remote_port: int | None = None
    tp_size: int | None = None
    # Tideserve's extension: where the prefill holds the blocks (services.common.dataplane.location).
    tideserve_kv: KVLocation | None = None


@dataclass(frozen=True)
class GenRequest:
    kind: Kind
    prompt_ids: tuple[int, ...]
    max_new_tokens: int
    stream: bool
    include_usage: bool
    model: str | None
    tenant: str
    bootstrap: Bootstrap | None
    rid: str | None
    kv_transfer: KVTransferParams | None = None


def _opt(body: Mapping[str, Any], key: str, types: tuple[type, ...], what: str) -> Any:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) and bool not in types:
        raise BadRequest(f"'{key}' must be {what}", key, "invalid_type")
    if not isinstance(value, types):
        raise BadRequest(f"'{key}' must be {what}", key, "invalid_type")
    return value


def _common(body: Any) -> Mapping[str, Any]:
    if not isinstance(body, Mapping):
        raise BadRequest("the request body must be a JSON object", None, "invalid_body")
    for key in ("temperature", "top_p", "presence_penalty", "frequency_penalty"):
        _opt(body, key, (int, float), "a number")
    n = _opt(body, "n", (int,), "an integer")
    if n not in (None, 1):
        raise BadRequest("only n=1 is supported", "n", "unsupported_value")
    stop = body.get("stop")
    if stop is not None and not isinstance(stop, str | list):
        raise BadRequest("'stop' must be a string or a list of strings", "stop", "invalid_type")
    return body


def _max_tokens(value: Any, key: str, default: int) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"'{key}' must be an integer", key, "invalid_type")
    if value <= 0:
        raise BadRequest(f"'{key}' must be at least 1, got {value}", key, "invalid_value")
    return value


def _token_ids(value: Any, key: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value
    ):
        raise BadRequest(f"'{key}' must be a list of non-negative integers", key, "invalid_type")
    return tuple(value)


def _tenant(body: Mapping[str, Any]) -> str:
    salt = _opt(body, "cache_salt", (str,), "a string") or _opt(body, "tenant", (str,), "a string")
    return str(salt or "")


def _bootstrap(body: Mapping[str, Any]) -> Bootstrap | None:
    host = _opt(body, "bootstrap_host", (str,), "a string")
    port = _opt(body, "bootstrap_port", (int,), "an integer")
    room = _opt(body, "bootstrap_room", (int,), "an integer")
    if host is None or room is None:
        return None
    return Bootstrap(host, port, room)


def _kv_transfer(body: Mapping[str, Any]) -> KVTransferParams | None:
    kv = _opt(body, "kv_transfer_params", (dict,), "an object")
    if kv is None:
        return None
    key = "kv_transfer_params"
    blocks = kv.get("remote_block_ids")
    if blocks is None:
        blocks = []
    # vLLM >= 0.10 sends one list per KV-cache group; flatten those.
    if isinstance(blocks, list) and blocks and all(isinstance(b, list) for b in blocks):
        blocks = [x for b in blocks for x in b]
    if not isinstance(blocks, list) or not all(
        isinstance(b, int) and not isinstance(b, bool) for b in blocks
    ):
        raise BadRequest(
            f"'{key}.remote_block_ids' must be a list of integers", key, "invalid_type"
        )
    tp = kv.get("tp_size", kv.get("remote_tp_size"))
    if isinstance(tp, str) and tp.isdigit():
        tp = int(tp)
    engine = _opt(kv, "remote_engine_id", (str,), "a string")
    loc = None
    if kv.get("tideserve_kv") is not None:
        try:
            loc = KVLocation.from_json(kv["tideserve_kv"])
        except ValueError as err:
            raise BadRequest(f"'{key}.tideserve_kv' {err}", key, "invalid_type") from err
    return KVTransferParams(
        do_remote_decode=bool(_opt(kv, "do_remote_decode", (bool,), "a boolean")),
        do_remote_prefill=bool(_opt(kv, "do_remote_prefill", (bool,), "a boolean")),
        remote_engine_id=engine,
        remote_request_id=_opt(kv, "remote_request_id", (str,), "a string"),
        remote_block_ids=tuple(blocks),
        remote_host=_opt(kv, "remote_host", (str,), "a string"),
        remote_port=_opt(kv, "remote_port", (int,), "an integer"),
        tp_size=tp if isinstance(tp, int) and not isinstance(tp, bool) else None,
        tideserve_kv=loc,
    )


def _stream(body: Mapping[str, Any]) -> tuple[bool, bool]:
    stream = bool(_opt(body, "stream", (bool,), "a boolean"))
    opts = _opt(body, "stream_options", (dict,), "an object") or {}
    include = bool(_opt(opts, "include_usage", (bool,), "a boolean"))
    return stream, include


def _nonempty(ids: tuple[int, ...], param: str) -> tuple[int, ...]:
    if not ids:
        raise BadRequest("the prompt is empty", param, "empty_prompt")
    return ids


def parse_generate(body: Any, default_max: int, tokens: TokenPath | None = None) -> GenRequest:
    body = _common(body)
    sp = _opt(body, "sampling_params", (dict,), "an object") or {}
    for key in ("temperature", "top_p"):
        _opt(sp, key, (int, float), "a number")
    _opt(sp, "ignore_eos", (bool,), "a boolean")
    if body.get("input_ids") is not None:
        ids = _token_ids(body["input_ids"], "input_ids")
    else:
        text = _opt(body, "text", (str,), "a string")
        if text is None:
            raise BadRequest("one of 'text' or 'input_ids' is required", "text", "missing")
        ids = _encode(tokens or TokenPath(), text, "text")
    rid = _opt(body, "rid", (str,), "a string")
    stream = bool(_opt(body, "stream", (bool,), "a boolean"))
    return GenRequest(
        "generate",
        _nonempty(ids, "text"),
        _max_tokens(sp.get("max_new_tokens"), "max_new_tokens", default_max),
        stream,
        False,
        _opt(body, "model", (str,), "a string"),
        _tenant(body),
        _bootstrap(body),
        rid,
        _kv_transfer(body),
    )


def _encode(tokens: TokenPath, text: str, param: str) -> tuple[int, ...]:
    try:
        return tuple(tokens.encode(text, param))
    except ChatError as e:
        raise BadRequest(e.message, e.param, e.code) from None


def parse_completion(body: Any, default_max: int, tokens: TokenPath | None = None) -> GenRequest:
    body = _common(body)
    tokens = tokens or TokenPath()
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        ids = _encode(tokens, prompt, "prompt")
    elif isinstance(prompt, list) and prompt and all(isinstance(p, int) for p in prompt):
        ids = _token_ids(prompt, "prompt")
    elif isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        ids = _encode(tokens, prompt[0], "prompt")
    elif prompt is None:
        raise BadRequest("'prompt' is required", "prompt", "missing")
    else:
        raise BadRequest(
            "'prompt' must be a string or a list of token ids", "prompt", "invalid_type"
        )
    stream, include = _stream(body)
    return GenRequest(
        "completion",
        _nonempty(ids, "prompt"),
        _max_tokens(body.get("max_tokens"), "max_tokens", default_max),
        stream,
        include,
        _opt(body, "model", (str,), "a string"),
        _tenant(body),
        _bootstrap(body),
        _opt(body, "rid", (str,), "a string"),
        _kv_transfer(body),
    )


def parse_chat(body: Any, default_max: int, tokens: TokenPath | None = None) -> GenRequest:
    body = _common(body)
    try:
        ids = tuple((tokens or TokenPath()).encode_chat(body.get("messages"), body.get("tools")))
    except ChatError as e:
        raise BadRequest(e.message, e.param, e.code) from None
    key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    stream, include = _stream(body)
    return GenRequest(
        "chat",
        _nonempty(ids, "messages"),
        _max_tokens(body.get(key), key, default_max),
        stream,
        include,
        _opt(body, "model", (str,), "a string"),
        _tenant(body),
        _bootstrap(body),
        _opt(body, "rid", (str,), "a string"),
        _kv_transfer(body),
    )


def messages_chat(body: Any, *, need_max_tokens: bool = True) -> ChatForm:
    """The canonical chat body of an Anthropic Messages body. Raises :class:`BadRequest`."""
    try:
        return to_chat(body, need_max_tokens=need_max_tokens)
    except MessagesError as e:
        raise BadRequest(e.message, e.param, "invalid_value") from None


# -- responses ---------------------------------------------------------------------------
def render(token_ids: list[int] | tuple[int, ...], leading_space: bool) -> str:
    """Text of generated tokens (words ``t<id>`` separated by spaces)."""
    text = " ".join(render_token(t) for t in token_ids)
    return (" " + text) if (leading_space and text) else text


def usage(
    prompt: int, completion: int, cached: int, kv: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """OpenAI ``usage``; a decode that pulled its KV over the data plane adds ``kv``
    (:func:`kv_transfer_fields`; the gateway records them)."""
    out: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }
    out.update(kv or {})
    return out


def kv_transfer_fields(ms: float, nbytes: int, failed: bool) -> dict[str, Any]:
    """What a decode says about its KV pull in ``usage`` / ``meta_info``: the transfer's
    wall ``kv_transfer_ms`` and ``kv_transfer_bytes``, or ``kv_transfer_failed`` (the pull
    failed and the prompt was recomputed); nothing when there was no pull."""
    if failed:
        return {"kv_transfer_failed": True}
    if ms <= 0:
        return {}
    return {"kv_transfer_ms": round(ms, 3), "kv_transfer_bytes": nbytes}


def completion_chunk(
    cid: str, model: str, text: str, finish: str | None, use: dict[str, Any] | None = None
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": cid,
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}],
    }
    if use is not None:
        out["usage"] = use
    return out


def chat_chunk(
    cid: str,
    model: str,
    text: str | None,
    finish: str | None,
    use: dict[str, Any] | None = None,
    *,
    first: bool = False,
) -> dict[str, Any]:
    delta: dict[str, Any] = {}
    if first:
        delta["role"] = "assistant"
    if text is not None:
        delta["content"] = text
    out: dict[str, Any] = {
        "id": cid,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }
    if use is not None:
        out["usage"] = use
    return out


def completion_response(cid: str, model: str, text: str, use: dict[str, Any]) -> dict[str, Any]:
    out = completion_chunk(cid, model, text, "length", use)
    return out


def chat_response(cid: str, model: str, text: str, use: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": cid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": "length",
            }
        ],
        "usage": use,
    }
