"""Agents' own session headers and body fields normalised to (session, parent session)."""

from __future__ import annotations

from typing import Any

import pytest

from services.scheduler.http.sessions import Session, SessionError, session_of

CASES = [
    pytest.param({}, {}, ("", ""), id="none"),
    pytest.param({"X-Tideserve-Session": "ts"}, {}, ("ts", ""), id="ours"),
    pytest.param({"X-Tideserve-Session": "ts", "X-Tideserve-Parent-Session": "p"}, {}, ("ts", "p"), id="ours-with-parent"),
    pytest.param({"X-Tideserve-Session": "ts", "x-claude-code-session-id": "cc"}, {"session_id": "b"}, ("ts", ""), id="ours-first"),
    pytest.param({"x-claude-code-session-id": "cc"}, {"session_id": "b"}, ("b", ""), id="our-body-field-before-agents"),
    pytest.param({"x-claude-code-session-id": "cc"}, {}, ("cc", ""), id="claude-code"),
    pytest.param({"x-claude-code-session-id": "cc", "x-claude-code-agent-id": "a1"}, {}, ("a1", "cc"), id="claude-code-sub-agent"),
    pytest.param({"x-claude-code-session-id": "cc", "x-claude-code-agent-id": "a2", "x-claude-code-parent-agent-id": "a1"}, {}, ("a2", "a1"), id="claude-code-nested-agent"),
    pytest.param({"x-claude-code-agent-id": "a1"}, {}, ("a1", ""), id="claude-code-agent-alone"),
    pytest.param({"session-id": "cx"}, {}, ("cx", ""), id="codex"),
    pytest.param({"x-session-id": "oc", "x-parent-session-id": "op"}, {}, ("oc", "op"), id="opencode"),
    pytest.param({"x-parent-session-id": "op"}, {}, ("", ""), id="parent-alone-ignored"),
    pytest.param({"session-id": "cx"}, {"prompt_cache_key": "k"}, ("cx", ""), id="headers-before-bodies"),
    pytest.param({}, {"prompt_cache_key": "k"}, ("k", ""), id="openai-prompt_cache_key"),
    pytest.param({}, {"metadata": {"user_id": "u_session_1"}}, ("u_session_1", ""), id="anthropic-user_id"),
    pytest.param({}, {"prompt_cache_key": "k", "metadata": {"user_id": "u"}}, ("k", ""), id="prompt_cache_key-first"),
    pytest.param({}, {"metadata": {"user_id": 5}}, ("", ""), id="user_id-not-a-string"),
    pytest.param({"x-session-id": "same", "x-parent-session-id": "same"}, {}, ("same", ""), id="own-parent-dropped"),
]  # fmt: skip


@pytest.mark.parametrize(("headers", "body", "want"), CASES)
def test_session_mapping(
    headers: dict[str, str], body: dict[str, Any], want: tuple[str, str]
) -> None:
    s = session_of(headers, body)
    assert (s.session_id, s.parent_session_id) == want and not s.final


@pytest.mark.parametrize(
    ("value", "final"),
    [("1", True), ("true", True), ("TRUE", True), ("yes", True), ("0", False), ("false", False), ("", False)],
    ids=repr,
)  # fmt: skip
def test_final_turn_header(value: str, final: bool) -> None:
    s = session_of({"X-Tideserve-Session": "s", "X-Tideserve-Session-Final": value}, {})
    assert s == Session("s", "", final)


@pytest.mark.parametrize(
    ("headers", "body", "param"),
    [
        pytest.param(
            {"X-Tideserve-Session-Final": "maybe"}, {}, "X-Tideserve-Session-Final", id="final"
        ),
        pytest.param({}, {"session_id": 3}, "session_id", id="session_id"),
        pytest.param({}, {"prompt_cache_key": ["k"]}, "prompt_cache_key", id="prompt_cache_key"),
    ],
)
def test_bad_session_fields(headers: dict[str, str], body: dict[str, Any], param: str) -> None:
    with pytest.raises(SessionError) as e:
        session_of(headers, body)
    assert e.value.param == param
