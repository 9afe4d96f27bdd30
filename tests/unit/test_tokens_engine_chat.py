"""What each engine kind hands its chat template: vLLM's parsed tools and tool-call arguments."""

from __future__ import annotations

from typing import Any

import pytest

from services.common.tokens.engine_chat import engine_chat_inputs
from services.common.tokens.hashing import HashScheme

TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}, "x": 1}}
VLLM_TOOL = {
    "type": "function",
    "function": {"name": "f", "description": None, "parameters": {"type": "object"}},
}


def call(arguments: Any) -> dict[str, Any]:
    return {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}


@pytest.mark.parametrize(
    ("scheme", "messages", "tools", "want_messages", "want_tools"),
    [
        ("vllm", [{"role": "user", "content": "hi"}], None, None, None),
        ("vllm", [{"role": "user", "content": "hi"}], [TOOL], None, [VLLM_TOOL]),
        (
            "vllm",
            [],
            [{"type": "function", "function": {"name": "g", "strict": True}}],
            None,
            [
                {
                    "type": "function",
                    "function": {
                        "name": "g",
                        "description": None,
                        "parameters": None,
                        "strict": True,
                    },
                }
            ],
        ),
        (
            "vllm",
            [{"role": "assistant", "content": "", "tool_calls": [call('{"a": 1}')]}],
            None,
            [{"role": "assistant", "content": "", "tool_calls": [call({"a": 1})]}],
            None,
        ),
        (
            "vllm",
            [
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [call("not json"), call("[1]"), call("")],
                }
            ],
            None,
            [{"role": "assistant", "content": "", "tool_calls": [call({}), call({}), call({})]}],
            None,
        ),
        (
            "vllm",
            [{"role": "assistant", "content": "x", "tool_calls": []}],
            [],
            [{"role": "assistant", "content": "x"}],
            None,
        ),
        (
            "sglang",
            [{"role": "assistant", "content": "", "tool_calls": [call('{"a": 1}')]}],
            [TOOL],
            None,
            [TOOL],
        ),
        ("tideserve", [], "not a list", None, None),
    ],
    ids=[
        "vllm-no-tools",
        "vllm-tool-normalised",
        "vllm-strict-kept",
        "vllm-arguments-parsed",
        "vllm-bad-arguments-empty-object",
        "vllm-empty-tool-calls-dropped",
        "sglang-as-sent",
        "tools-not-a-list",
    ],
)
def test_engine_chat_inputs(
    scheme: HashScheme,
    messages: list[dict[str, Any]],
    tools: Any,
    want_messages: list[dict[str, Any]] | None,
    want_tools: list[dict[str, Any]] | None,
) -> None:
    got_messages, got_tools = engine_chat_inputs(scheme, messages, tools)
    assert got_messages == (messages if want_messages is None else want_messages)
    assert got_tools == want_tools
