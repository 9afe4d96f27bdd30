"""Stored-response chains rebuilt without I/O, and the Responses intake's tokenization:
a Responses request and its equivalent chat request give the same prompt ids and block
hashes (the one tokenization path), with the simulator's and a model's tokenizer."""

from __future__ import annotations

import json
from typing import Any

import pytest

from services.common.apis.responses import chat_body, parse_responses
from services.common.tokens import TokenPath, token_path
from services.common.tokens.engine_chat import adds_special_tokens
from services.common.tokens.hashing import HashScheme
from services.scheduler.http.openai import ApiError, parse_request
from services.scheduler.responses.chain import ChainBroken, StoredResponse, rebuild
from tests.helpers.model_dir import write_model_dir


def _row(rid: str, prev: str | None, tenant: str = "t", expires: float = 100.0) -> StoredResponse:
    inp = (
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": f"in-{rid}"}],
        },
    )
    out = (
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": f"out-{rid}"}],
        },
    )
    return StoredResponse(rid, tenant, "m", 0.0, expires, prev, inp, out)  # fmt: skip


def _texts(items: list[dict[str, Any]]) -> list[str]:
    return [str(i["content"][0]["text"]) for i in items]


ROWS = {r.id: r for r in [_row("a", None), _row("b", "a"), _row("c", "b")]}


def test_chain_is_rebuilt_oldest_first() -> None:
    items = rebuild(ROWS, "c", "t", 50.0, 10)
    assert _texts(items) == ["in-a", "out-a", "in-b", "out-b", "in-c", "out-c"]


BROKEN = [
    ("missing link", {"c": ROWS["c"], "b": ROWS["b"]}, "c", "t", 50.0, 10, "a"),
    ("expired link", {**ROWS, "a": _row("a", None, expires=10.0)}, "c", "t", 50.0, 10, "a"),
    ("expired start", ROWS, "c", "t", 100.0, 10, "c"),
    ("another tenant's", ROWS, "c", "u", 50.0, 10, "c"),
    ("a foreign link", {**ROWS, "b": _row("b", "a", tenant="u")}, "c", "t", 50.0, 10, "b"),
    ("cycle", {"x": _row("x", "y"), "y": _row("y", "x")}, "x", "t", 50.0, 10, "x"),
    ("too deep", ROWS, "c", "t", 50.0, 2, "c"),
    ("unknown id", ROWS, "zz", "t", 50.0, 10, "zz"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("rows", "start", "tenant", "now", "depth", "missing"),
    [b[1:] for b in BROKEN],
    ids=[b[0] for b in BROKEN],
)
def test_broken_chains_are_unknown(
    rows: dict[str, StoredResponse], start: str, tenant: str, now: float, depth: int, missing: str
) -> None:
    with pytest.raises(ChainBroken) as e:
        rebuild(rows, start, tenant, now, depth)
    assert e.value.missing == missing


TOOLS = [{"type": "function", "name": "read", "parameters": {"type": "object"}}]
CHAT_TOOLS = [{"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}}]
CALL = {"id": "c1", "type": "function", "function": {"name": "read", "arguments": "{}"}}
LONG = " ".join(f"the quick brown fox {i}" for i in range(30))
PAIRS = [
    (
        "text",
        {"instructions": "be brief", "input": LONG},
        {
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": LONG},
            ]
        },
    ),
    (
        "tool round trip",
        {
            "input": [
                {"role": "user", "content": LONG},
                {"type": "function_call", "call_id": "c1", "name": "read", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "lazy dog"},
            ],
            "tools": TOOLS,
        },
        {
            "messages": [
                {"role": "user", "content": LONG},
                {"role": "assistant", "content": None, "tool_calls": [CALL]},
                {"role": "tool", "tool_call_id": "c1", "content": "lazy dog"},
            ],
            "tools": CHAT_TOOLS,
        },
    ),
]


@pytest.fixture(scope="module")
def model_tokens(tmp_path_factory: pytest.TempPathFactory) -> TokenPath:
    return token_path(write_model_dir(tmp_path_factory.mktemp("model")), "vllm")


@pytest.mark.parametrize("which", ["simulator", "model"])
@pytest.mark.parametrize(("responses", "chat"), [p[1:] for p in PAIRS], ids=[p[0] for p in PAIRS])
def test_responses_and_chat_give_the_same_prompt_and_hashes(
    responses: dict[str, Any], chat: dict[str, Any], which: str, model_tokens: TokenPath
) -> None:
    tokens = model_tokens if which == "model" else TokenPath()
    kw: dict[str, Any] = {"models": (), "classes": (), "tokens": tokens}
    canonical = chat_body(parse_responses({"model": "m", **responses}))
    raw = json.dumps({"model": "m", **responses}).encode()
    chat_raw = json.dumps({"model": "m", **chat}).encode()
    if which == "model" and "tools" in chat:  # its template refuses the tool role: both 400
        with pytest.raises(ApiError) as ea:
            parse_request("responses", raw, {}, canonical=canonical, **kw)
        with pytest.raises(ApiError) as eb:
            parse_request("chat", chat_raw, {}, **kw)
        assert (ea.value.status, ea.value.message) == (eb.value.status, eb.value.message)
        return
    a = parse_request("responses", raw, {}, canonical=canonical, **kw)
    b = parse_request("chat", chat_raw, {}, **kw)
    assert a.kind == "responses" and a.prompt_ids == b.prompt_ids and len(a.prompt_ids) > 32
    assert tokens.block_hashes(a.prompt_ids, 16) == tokens.block_hashes(b.prompt_ids, 16)
    assert a.tools_offered == b.tools_offered and a.tool_results == b.tool_results


@pytest.mark.parametrize(
    ("scheme", "api", "native", "expected"),
    [
        ("vllm", "responses", True, True),
        ("vllm", "responses", False, False),
        ("vllm", "messages", True, False),
        ("vllm", "chat", True, False),
        ("sglang", "responses", True, False),
        ("tideserve", "responses", True, False),
    ],
    ids=["vllm-native-responses", "vllm-translated", "vllm-native-messages", "vllm-chat",
         "sglang", "simulator"],
)  # fmt: skip
def test_which_native_apis_add_the_tokenizers_special_tokens(
    scheme: HashScheme, api: str, native: bool, expected: bool
) -> None:
    assert adds_special_tokens(scheme, api, native) is expected


def test_a_native_vllm_responses_prompt_carries_the_tokenizers_bos_too(
    model_tokens: TokenPath,
) -> None:
    """vLLM 0.32's own /v1/responses adds the tokenizer's BOS on top of the template's: the
    gateway's ids, and so its block hashes from the first block on, must do the same."""
    body = {"model": "m", "input": LONG}
    canonical = chat_body(parse_responses(body))
    kw: dict[str, Any] = {"models": (), "classes": (), "tokens": model_tokens}
    raw = json.dumps(body).encode()
    plain = parse_request("responses", raw, {}, canonical=canonical, **kw)
    native = parse_request("responses", raw, {}, canonical=canonical, special_tokens=True, **kw)
    assert native.prompt_ids[1:] == plain.prompt_ids
    assert native.prompt_ids[0] == plain.prompt_ids[0]  # the BOS twice, as vLLM renders it
    assert (
        model_tokens.block_hashes(native.prompt_ids, 16)[0]
        != model_tokens.block_hashes(plain.prompt_ids, 16)[0]
    )
