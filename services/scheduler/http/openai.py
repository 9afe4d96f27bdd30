"""Parsing and validation of OpenAI-compatible requests (pure).

Request metadata, header first, then body field (headers win):

| what | header | body field |
|---|---|---|
| SLO class | ``X-Tideserve-Class`` | ``slo_class`` |
| tenant (fair share) | ``X-Tideserve-Tenant`` | ``tenant`` |
| session / agent id | ``X-Tideserve-Session`` | ``session_id`` |
| parent session (a sub-agent's) | ``X-Tideserve-Parent-Session`` | — |
| the session ends with this turn | ``X-Tideserve-Session-Final: 1`` | — |
| TTFT deadline, ms from now | ``X-Tideserve-Deadline-Ms`` | — |
| scheduler profile | ``X-Tideserve-Profile`` | — |

Agents' own session headers and body fields (Claude Code, Codex, OpenCode, OpenAI's
``prompt_cache_key``, Anthropic's ``metadata.user_id``) are read too, after ours:
:mod:`services.scheduler.http.sessions`.

APIs (``Kind``): ``chat`` (``/v1/chat/completions``), ``completion`` (``/v1/completions``),
``generate`` (SGLang's ``/generate``) and ``messages`` (Anthropic's ``/v1/messages``),
which is validated and translated to its canonical chat body
(:func:`services.common.apis.anthropic.to_chat`) and from there parsed as chat: the same
prompt ids and block hashes as the equivalent chat request. Its ``cache_control`` marks
give :attr:`ParsedRequest.stable_prefix_tokens`.

These fields are removed before the body is forwarded (a body without them is forwarded as
the client sent it: ``raw_body``, no re-encoding). The prefix-cache namespace is the
body's ``cache_salt`` (vLLM's name), forwarded unchanged and used to salt block hashes.

Prompts are tokenized by the deployment's :class:`services.common.tokens.TokenPath` (the
simulator's whitespace tokenizer and ``"<role>: <content>"`` template by default, or the
model's tokenizer and chat template); content parts other than text are a 400
(``services.common.tokens.chat``).
Kind ``responses`` (the Responses API, :mod:`services.scheduler.http.responses`) is parsed
from its canonical chat body (``canonical``), and kind ``messages`` (Anthropic Messages) is
translated into one here, so both are tokenized exactly as chat is.
Every problem raises :class:`ApiError` (400/404/413); the route renders it in its API's
error shape (OpenAI's here; Anthropic's for ``messages``, :mod:`.errors`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from services.common import jsonfast
from services.common.apis.anthropic import MessagesError, to_chat
from services.common.tokens import ChatError, TokenPath
from services.scheduler.core.intake import Intake
from services.scheduler.core.tools import ToolResultFact, tool_results_of, tools_offered
from services.scheduler.http.sessions import SessionError, session_of

Kind = Literal["chat", "completion", "generate", "messages", "responses"]
_CHAT_LIKE = ("chat", "messages", "responses")  # tokenized as chat messages (translated)

H_CLASS = "X-Tideserve-Class"
H_TENANT = "X-Tideserve-Tenant"
H_DEADLINE = "X-Tideserve-Deadline-Ms"
H_PROFILE = "X-Tideserve-Profile"
_OURS = ("slo_class", "tenant", "session_id")


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        etype: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.etype = (
            status,
            message,
            param,
            code,
            etype,
        )

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.etype, self.param, self.code)


def error_body(
    message: str, etype: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": etype, "param": param, "code": code}}


@dataclass(frozen=True, slots=True)
class Limits:
    """Request limits (all set by the scheduler's settings): body bytes (413), ``max_tokens``
    (400), prompt tokens (413), chat messages (400) and request-header bytes (431, checked
    by :func:`services.scheduler.http.limits.header_limit`)."""

    max_body_bytes: int = 32 * 1024 * 1024
    max_tokens: int = 131_072
    default_max_tokens: int = 256
    max_prompt_tokens: int = 1_000_000
    max_messages: int = 10_000
    max_header_bytes: int = 32 * 1024


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    kind: Kind
    model: str
    prompt_ids: tuple[int, ...]
    max_tokens: int
    stream: bool
    tenant: str
    slo_class: str
    session_id: str
    cache_salt: str
    profile: str
    deadline_ms: float | None
    forward_body: dict[str, Any]
    tools_offered: int = 0
    tool_results: tuple[ToolResultFact, ...] = ()
    raw_body: bytes = b""
    """The client's body when it equals ``forward_body`` (none of our fields in it): sent
    upstream as is; b"" when the forwarded body must be encoded from ``forward_body``."""
    parent_session_id: str = ""
    session_final: bool = False
    """The session ends with this turn (``X-Tideserve-Session-Final``)."""
    stable_prefix_tokens: int | None = None
    """Messages: where the last ``cache_control`` mark ends, in prompt tokens (the canonical
    messages up to it, rendered alone; None: no mark). Recorded only: no routing or
    admission step reads it yet."""
    native_body: dict[str, Any] | None = None
    """Messages: the client's body without our fields, for engines serving the API natively
    (``forward_body`` is the canonical chat body)."""


def _bad(msg: str, param: str | None = None, code: str = "invalid_value") -> ApiError:
    return ApiError(400, msg, param, code)


def _str_field(body: Mapping[str, Any], key: str) -> str:
    v = body.get(key)
    if v is None:
        return ""
    if not isinstance(v, str):
        raise _bad(f"'{key}' must be a string", key, "invalid_type")
    return v


def _int_field(body: Mapping[str, Any], key: str) -> int | None:
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise _bad(f"'{key}' must be an integer", key, "invalid_type")
    return v


def _prompt_ids(
    kind: Kind, body: Mapping[str, Any], tokens: TokenPath, special_tokens: bool = False
) -> tuple[int, ...]:
    if kind in _CHAT_LIKE:
        try:
            msgs, tools = body.get("messages"), body.get("tools")
            return tuple(tokens.encode_chat(msgs, tools, special_tokens=special_tokens))
        except ChatError as e:
            raise _bad(e.message, e.param, e.code) from None
    key = "prompt" if kind == "completion" else "text"
    p = body.get(key)
    if kind == "generate" and p is None and body.get("input_ids") is not None:
        key, p = "input_ids", body.get("input_ids")
    if isinstance(p, list) and len(p) == 1 and isinstance(p[0], str):
        p = p[0]
    if isinstance(p, str):
        try:
            return tuple(tokens.encode(p, key))
        except ChatError as e:
            raise _bad(e.message, e.param, e.code) from None
    if (
        isinstance(p, list)
        and p
        and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in p)
    ):
        return tuple(p)
    if p is None:
        raise _bad(f"'{key}' is required", key, "missing")
    raise _bad(f"'{key}' must be a string or a list of token ids", key, "invalid_type")


def json_body(raw: bytes, max_body_bytes: int) -> dict[str, Any]:
    """The request body as a JSON object: 413 over ``max_body_bytes``, 400 for bad JSON or
    another JSON value (:class:`ApiError`)."""
    if len(raw) > max_body_bytes:
        raise ApiError(413, f"request body over {max_body_bytes} bytes", None, "body_too_large")
    try:
        body = jsonfast.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise _bad(f"invalid JSON body: {e}", None, "invalid_json") from None
    if not isinstance(body, dict):
        raise _bad("the request body must be a JSON object", None, "invalid_body")
    return body


def _messages_chat(body: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]] | None]:
    """A Messages body's canonical chat body (our fields kept, for the steps after) and its
    stable prefix (:class:`~services.common.apis.anthropic.ChatForm`)."""
    try:
        form = to_chat(body)
    except MessagesError as e:
        raise ApiError(e.status, e.message, e.param, "invalid_value") from None
    return {**form.body, **{k: body[k] for k in _OURS if k in body}}, form.stable_prefix


def _max_tokens(kind: Kind, body: Mapping[str, Any], lim: Limits) -> int | None:
    if kind == "generate":
        sp = body.get("sampling_params") or {}
        if not isinstance(sp, Mapping):
            raise _bad("'sampling_params' must be an object", "sampling_params", "invalid_type")
        mt, key = _int_field(sp, "max_new_tokens"), "max_new_tokens"
    else:
        mt, key = _int_field(body, "max_tokens"), "max_tokens"
        if kind in ("chat", "responses") and mt is None:
            mt, key = _int_field(body, "max_completion_tokens"), "max_completion_tokens"
    if mt is not None and not 1 <= mt <= lim.max_tokens:
        raise _bad(f"'{key}' must be between 1 and {lim.max_tokens}, got {mt}", key)
    return mt


def _prefix_tokens(
    prefix: list[dict[str, Any]] | None, body: Mapping[str, Any], n: int, tokens: TokenPath
) -> int | None:
    """Prompt tokens up to the last cache mark: the whole prompt when the mark is on the
    last message, else the prefix rendered alone (tools only: 0)."""
    if prefix is None:
        return None
    msgs = body.get("messages")
    if isinstance(msgs, list) and len(prefix) == len(msgs) and prefix[-1] is msgs[-1]:
        return n
    if not prefix:
        return 0
    try:
        return len(tokens.encode_chat(prefix, body.get("tools")))
    except ChatError:
        return None


def _checked_ids(
    kind: Kind, body: Mapping[str, Any], lim: Limits, tokens: TokenPath, special_tokens: bool
) -> tuple[int, ...]:
    chatty = kind in _CHAT_LIKE
    msgs = body.get("messages") if chatty else None
    if isinstance(msgs, list) and len(msgs) > lim.max_messages:
        raise _bad(
            f"{len(msgs)} messages is over the limit of {lim.max_messages}",
            "messages",
            "too_many_messages",
        )
    ids = _prompt_ids("chat" if chatty else kind, body, tokens, special_tokens)
    if not ids:
        raise _bad("the prompt is empty", "messages" if chatty else "prompt", "empty")
    if len(ids) > lim.max_prompt_tokens:
        raise ApiError(
            413,
            f"prompt of {len(ids)} tokens is over {lim.max_prompt_tokens}",
            "messages" if chatty else "prompt",
            "prompt_too_long",
        )
    return ids


def _deadline(headers: Mapping[str, str]) -> float | None:
    if not headers.get(H_DEADLINE):
        return None
    try:
        deadline = float(headers[H_DEADLINE])
    except ValueError:
        raise _bad(f"{H_DEADLINE} must be a number of milliseconds", H_DEADLINE) from None
    if not deadline > 0:
        raise _bad(f"{H_DEADLINE} must be positive", H_DEADLINE)
    return deadline


def parse_request(
    kind: Kind,
    raw: bytes,
    headers: Mapping[str, str],
    *,
    models: Collection[str],
    classes: Collection[str],
    tenants: Collection[str] | None = None,
    limits: Limits | None = None,
    tokens: TokenPath | None = None,
    tool_contents: bool = False,
    canonical: Mapping[str, Any] | None = None,
    special_tokens: bool = False,
) -> ParsedRequest:
    """Validate one request. ``models`` empty = accept any model name; ``tenants`` None =
    any tenant; ``tokens`` = the deployment's tokenization path (None = the simulator's).
    A chat request's tools offered and tool results (:mod:`services.scheduler.core.tools`)
    are taken, with the results' contents only when ``tool_contents``.
    ``canonical``: the body already decoded and translated into the chat form (kind
    ``responses``; ``raw`` is then only measured, and the body is forwarded re-encoded).
    ``special_tokens``: the prompt is tokenized with the tokenizer's special tokens on top of
    the template's, as the engine will
    (:func:`~services.common.tokens.engine_chat.adds_special_tokens`).
    Raises :class:`ApiError`."""
    lim = limits or Limits()
    tokens = tokens or TokenPath()
    if canonical is not None:
        if len(raw) > lim.max_body_bytes:
            raise ApiError(
                413, f"request body over {lim.max_body_bytes} bytes", None, "body_too_large"
            )
        client = dict(canonical)
    else:
        client = json_body(raw, lim.max_body_bytes)
    body, prefix = _messages_chat(client) if kind == "messages" else (client, None)
    model = _str_field(body, "model")
    if kind != "generate" and not model:
        raise _bad("'model' is required", "model", "missing")
    if model and models and model not in models:
        raise ApiError(404, f"model {model!r} does not exist", "model", "model_not_found")
    mt = _max_tokens(kind, body, lim)
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise _bad("'stream' must be a boolean", "stream", "invalid_type")
    ids = _checked_ids(kind, body, lim, tokens, special_tokens)
    slo = headers.get(H_CLASS) or _str_field(body, "slo_class")
    if slo and slo not in classes:
        raise _bad(f"unknown SLO class {slo!r} (known: {sorted(classes)})", "slo_class")
    tenant = headers.get(H_TENANT) or _str_field(body, "tenant")
    if tenants is not None and not tenant:
        raise _bad(f"a tenant is required: set {H_TENANT} or 'tenant'", "tenant", "missing")
    if tenants is not None and tenant not in tenants:
        raise _bad(f"unknown tenant {tenant!r}", "tenant")
    try:
        session = session_of(headers, client)
    except SessionError as e:
        raise _bad(e.message, e.param, "invalid_type") from None
    ours = any(k in body for k in _OURS)
    fwd = {k: v for k, v in body.items() if k not in _OURS} if ours else body
    chatty = kind in _CHAT_LIKE
    return ParsedRequest(
        kind=kind,
        model=model,
        prompt_ids=ids,
        max_tokens=mt if mt is not None else lim.default_max_tokens,
        stream=stream,
        tenant=tenant,
        slo_class=slo,
        session_id=session.session_id,
        cache_salt=_str_field(body, "cache_salt"),
        profile=headers.get(H_PROFILE, ""),
        deadline_ms=_deadline(headers),
        forward_body=fwd,
        tools_offered=tools_offered(body) if chatty else 0,
        tool_results=tool_results_of(body.get("messages"), tool_contents) if chatty else (),
        raw_body=b"" if ours or kind == "messages" or canonical is not None else raw,
        parent_session_id=session.parent_session_id,
        session_final=session.final,
        stable_prefix_tokens=_prefix_tokens(prefix, body, len(ids), tokens),
        native_body={k: v for k, v in client.items() if k not in _OURS}
        if kind == "messages"
        else None,
    )


def intake_of(rid: str, p: ParsedRequest, tokens: TokenPath, block_size: int) -> Intake:
    """What the routing core takes in of a validated request: its prompt as block hashes (in
    the cache-salt's chain, as the engine hashes them), limits, identity and class."""
    return Intake(
        request_id=rid,
        prompt_tokens=len(p.prompt_ids),
        block_hashes=tuple(tokens.block_hashes(p.prompt_ids, block_size, tenant=p.cache_salt)),
        max_tokens=p.max_tokens,
        tenant=p.tenant,
        slo_class=p.slo_class,
        session_id=p.session_id,
        parent_session_id=p.parent_session_id,
        profile=p.profile,
        index_tenant=tokens.index_tenant(p.cache_salt),
        deadline_in_ms=p.deadline_ms,
        session_final=p.session_final,
    )
