"""An agent's own session identity, normalised to (session, parent session) (pure).

Coding agents name their sessions in their own headers; the gateway reads the first that is
present, ours first, for every API (chat, completions, generate, messages):

| source | session | parent session |
|---|---|---|
| ``X-Tideserve-Session`` / ``X-Tideserve-Parent-Session`` | the value | the value |
| body ``session_id`` (ours) | the value | — |
| Claude Code ``x-claude-code-session-id`` | the value | — |
| Claude Code sub-agent ``x-claude-code-agent-id`` | the agent id | ``x-claude-code-parent-agent-id``, else the session id |
| Codex ``session-id`` | the value | — |
| OpenCode ``x-session-id`` / ``x-parent-session-id`` | the value | the value |
| body ``prompt_cache_key`` (OpenAI) | the value | — |
| body ``metadata.user_id`` (Anthropic) | the value | — |

A parent header without a session header of its own kind is ignored. ``X-Tideserve-Session-Final: 1``
(or ``true``) says the session ends with this turn: the gateway releases what routing keeps
for it once the turn is answered (:attr:`Session.final`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "H_FINAL",
    "H_PARENT",
    "H_SESSION",
    "Session",
    "SessionError",
    "session_of",
]

H_SESSION = "X-Tideserve-Session"
H_PARENT = "X-Tideserve-Parent-Session"
H_FINAL = "X-Tideserve-Session-Final"

CC_SESSION = "x-claude-code-session-id"
CC_AGENT = "x-claude-code-agent-id"
CC_PARENT_AGENT = "x-claude-code-parent-agent-id"
CODEX_SESSION = "session-id"
OC_SESSION = "x-session-id"
OC_PARENT = "x-parent-session-id"

_TRUE = frozenset({"1", "true", "yes"})
_FALSE = frozenset({"", "0", "false", "no"})


class SessionError(ValueError):
    """A session field of the wrong type or value; ``param`` names it."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.message, self.param = message, param


@dataclass(frozen=True, slots=True)
class Session:
    session_id: str = ""
    parent_session_id: str = ""
    final: bool = False


def _body_str(body: Mapping[str, Any], key: str) -> str:
    v = body.get(key)
    if v is None:
        return ""
    if not isinstance(v, str):
        raise SessionError(f"'{key}' must be a string", key)
    return v


def _user_id(body: Mapping[str, Any]) -> str:
    meta = body.get("metadata")
    uid = meta.get("user_id") if isinstance(meta, Mapping) else None
    return uid if isinstance(uid, str) else ""


def _ids(headers: Mapping[str, str], body: Mapping[str, Any]) -> tuple[str, str]:
    if headers.get(H_SESSION):
        return headers[H_SESSION], headers.get(H_PARENT, "")
    ours = _body_str(body, "session_id")
    if ours:
        return ours, headers.get(H_PARENT, "")
    cc = headers.get(CC_SESSION, "")
    agent = headers.get(CC_AGENT, "")
    if agent:
        return agent, headers.get(CC_PARENT_AGENT, "") or cc
    if cc:
        return cc, ""
    if headers.get(CODEX_SESSION):
        return headers[CODEX_SESSION], ""
    if headers.get(OC_SESSION):
        return headers[OC_SESSION], headers.get(OC_PARENT, "")
    key = _body_str(body, "prompt_cache_key")
    if key:
        return key, ""
    return _user_id(body), ""


def session_of(headers: Mapping[str, str], body: Mapping[str, Any]) -> Session:
    """The request's session (see the module doc). Raises :class:`SessionError`."""
    session, parent = _ids(headers, body)
    flag = headers.get(H_FINAL, "").strip().lower()
    if flag not in _TRUE and flag not in _FALSE:
        raise SessionError(f"{H_FINAL} must be 1 or 0 (true or false)", H_FINAL)
    return Session(session, parent if parent != session else "", flag in _TRUE)
