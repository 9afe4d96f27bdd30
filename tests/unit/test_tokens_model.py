"""The one tokenization path: a model directory's tokenizer and chat template (a BPE trained
at test time), the shared ``messages`` rule, and the whitespace default."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer as HFTokenizer

from services.common.tokens import (
    ChatError,
    HashScheme,
    ModelDirError,
    TokenPath,
    WhitespaceTokenizer,
    block_hashes,
    chat_prompt,
    load_model_tokenizer,
    token_path,
    tokenize,
)
from services.engine import api
from services.scheduler.http.openai import ApiError, parse_request
from tests.helpers.model_dir import PARTS_TEMPLATE, write_model_dir


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model_dir(tmp_path_factory.mktemp("model"))


@pytest.fixture(scope="module")
def parts_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model_dir(tmp_path_factory.mktemp("parts"), template=PARTS_TEMPLATE)


def _reference(model_dir: Path, text: str, specials: bool = False) -> list[int]:
    """What the engine computes: the tokenizers library on the text it renders."""
    tok = HFTokenizer.from_file(str(model_dir / "tokenizer.json"))
    return list(tok.encode(text, add_special_tokens=specials).ids)


TEXT_PARTS = [{"type": "text", "text": "hello there"}, {"type": "text", "text": "be brief"}]

CHAT_CASES: list[tuple[str, HashScheme, list[dict[str, Any]], str]] = [
    (
        "string-content",
        "vllm",
        [{"role": "user", "content": "hello there"}],
        "<s><|user|>\nhello there</s>\n<|assistant|>\n",
    ),
    (
        "system-and-turns-trimmed",
        "sglang",
        [
            {"role": "system", "content": "  be brief "},
            {"role": "user", "content": "how are you?"},
            {"role": "assistant", "content": "fine"},
            {"role": "user", "content": "the prefix"},
        ],
        "<s><|system|>\nbe brief</s>\n<|user|>\nhow are you?</s>\n<|assistant|>\nfine</s>\n"
        "<|user|>\nthe prefix</s>\n<|assistant|>\n",
    ),
    (
        "null-content",
        "vllm",
        [{"role": "user", "content": None}],
        "<s><|user|>\n</s>\n<|assistant|>\n",
    ),
    (
        "text-parts-vllm-newline",
        "vllm",
        [{"role": "user", "content": TEXT_PARTS}],
        "<s><|user|>\nhello there\nbe brief</s>\n<|assistant|>\n",
    ),
    (
        "text-parts-sglang-space",
        "sglang",
        [{"role": "user", "content": TEXT_PARTS}],
        "<s><|user|>\nhello there be brief</s>\n<|assistant|>\n",
    ),
    (
        "text-parts-simulator-space",
        "tideserve",
        [{"role": "user", "content": TEXT_PARTS}],
        "<s><|user|>\nhello there be brief</s>\n<|assistant|>\n",
    ),
]


@pytest.mark.parametrize(
    ("scheme", "messages", "rendered"),
    [c[1:] for c in CHAT_CASES],
    ids=[c[0] for c in CHAT_CASES],
)
def test_chat_ids_are_the_rendered_template_without_added_specials(
    model_dir: Path, scheme: HashScheme, messages: list[dict[str, Any]], rendered: str
) -> None:
    path = token_path(model_dir, scheme)
    ids = path.encode_chat(messages)
    assert ids == _reference(model_dir, rendered)
    assert ids[0] == _reference(model_dir, "<s>")[0]  # the template's BOS, exactly once
    assert ids.count(ids[0]) == 1


@pytest.mark.parametrize(
    ("content", "rendered"),
    [
        ("plain", "<s><|user|>\nplain</s>\n<|assistant|>\n"),
        (TEXT_PARTS, "<s><|user|>\n[hello there][be brief]</s>\n<|assistant|>\n"),
    ],
    ids=["string", "parts-passed-through"],
)
def test_template_iterating_over_content_gets_the_text_parts(
    parts_dir: Path, content: Any, rendered: str
) -> None:
    path = token_path(parts_dir, "vllm")
    assert path.encode_chat([{"role": "user", "content": content}]) == _reference(
        parts_dir, rendered
    )


@pytest.mark.parametrize(
    "text", ["hello there", "the quick brown fox", "a"], ids=["two", "four", "one"]
)
def test_completion_prompt_gets_the_post_processor_bos(model_dir: Path, text: str) -> None:
    path = token_path(model_dir)
    assert path.encode(text) == _reference(model_dir, text, specials=True)
    assert path.encode(text)[0] == _reference(model_dir, "<s>")[0]
    assert path.tokenizer.count(text) == len(path.encode(text))


def test_loaded_once_per_directory(model_dir: Path, tmp_path: Path) -> None:
    assert load_model_tokenizer(model_dir) is load_model_tokenizer(str(model_dir) + "/")
    assert token_path(model_dir, "vllm").tokenizer is token_path(model_dir, "sglang").tokenizer
    other = write_model_dir(tmp_path / "other")
    assert load_model_tokenizer(other) is not load_model_tokenizer(model_dir)


BAD_MESSAGES: list[tuple[str, Any, str]] = [
    ("empty", [], "invalid_type"),
    ("no-role", [{"content": "x"}], "invalid_type"),
    (
        "image-part",
        [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
        "unsupported_content",
    ),
    (
        "text-and-image",
        [
            {
                "role": "user",
                "content": [{"type": "text", "text": "hi"}, {"type": "input_audio"}],
            }
        ],
        "unsupported_content",
    ),
    (
        "text-not-string",
        [{"role": "user", "content": [{"type": "text", "text": 3}]}],
        "invalid_type",
    ),
    ("content-number", [{"role": "user", "content": 3}], "invalid_type"),
    ("lone-surrogate", [{"role": "user", "content": "half \ud83d a pair"}], "invalid_unicode"),
]


@pytest.mark.parametrize("with_model", [False, True], ids=["whitespace", "model"])
@pytest.mark.parametrize(
    ("messages", "code"), [c[1:] for c in BAD_MESSAGES], ids=[c[0] for c in BAD_MESSAGES]
)
def test_gateway_and_engine_refuse_the_same_messages_alike(
    model_dir: Path, with_model: bool, messages: Any, code: str
) -> None:
    path = token_path(model_dir if with_model else None)
    with pytest.raises(ChatError) as direct:
        path.encode_chat(messages)
    raw = json.dumps({"model": "m", "messages": messages}).encode()
    with pytest.raises(ApiError) as gw:
        parse_request("chat", raw, {}, models=(), classes=("agent",), tokens=path)
    with pytest.raises(api.BadRequest) as engine:
        api.parse_chat({"messages": messages}, 16, path)
    assert gw.value.status == 400
    assert direct.value.code == gw.value.code == engine.value.code == code
    assert gw.value.message == engine.value.message == direct.value.message


@pytest.mark.parametrize("with_model", [False, True], ids=["whitespace", "model"])
@pytest.mark.parametrize(
    ("prompt", "ok"),
    [("a \ud83d b", False), (["\udfff"], False), ("a \U0001f600 b", True)],
    ids=["lone-high", "lone-low-in-a-list", "a-pair-is-fine"],
)
def test_completion_prompt_with_a_lone_surrogate_is_a_400(
    model_dir: Path, with_model: bool, prompt: Any, ok: bool
) -> None:
    path = token_path(model_dir if with_model else None)
    raw = json.dumps({"model": "m", "prompt": prompt}).encode()
    if ok:
        assert parse_request("completion", raw, {}, models=(), classes=("agent",), tokens=path)
        assert api.parse_completion(json.loads(raw), 16, path).prompt_ids
        return
    with pytest.raises(ApiError) as gw:
        parse_request("completion", raw, {}, models=(), classes=("agent",), tokens=path)
    assert (gw.value.status, gw.value.code, gw.value.param) == (400, "invalid_unicode", "prompt")
    with pytest.raises(api.BadRequest) as engine:
        api.parse_completion(json.loads(raw), 16, path)
    assert (engine.value.code, engine.value.param) == ("invalid_unicode", "prompt")


def test_template_refusal_is_a_chat_error(model_dir: Path) -> None:
    with pytest.raises(ChatError, match="unknown role tool") as e:
        token_path(model_dir).encode_chat([{"role": "tool", "content": "x"}])
    assert e.value.code == "chat_template_error"


@pytest.mark.parametrize(
    "template",
    [
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ messages.append({'role': 'x'}) }}",
    ],
    ids=["dunder-escape", "mutation"],
)
def test_template_runs_sandboxed(tmp_path: Path, template: str) -> None:
    path = token_path(write_model_dir(tmp_path / "evil", template=template))
    with pytest.raises(ChatError) as e:
        path.encode_chat([{"role": "user", "content": "x"}])
    assert e.value.code == "chat_template_error"


@pytest.mark.parametrize(
    ("files", "match"),
    [
        ({}, "does not exist"),
        ({"tokenizer_config.json": "{}"}, "tokenizer.json"),
        ({"tokenizer.json": "not json", "tokenizer_config.json": "{}"}, "model directory"),
    ],
    ids=["missing-dir", "no-tokenizer-json", "bad-tokenizer-json"],
)
def test_unusable_model_directory(tmp_path: Path, files: dict[str, str], match: str) -> None:
    d = tmp_path / "m"
    if files:
        d.mkdir()
        for name, text in files.items():
            (d / name).write_text(text)
    with pytest.raises(ModelDirError, match=match):
        token_path(d)


def test_model_without_chat_template_refuses_chat_but_not_completions(tmp_path: Path) -> None:
    d = write_model_dir(tmp_path / "plain", template="")
    path = token_path(d)
    assert path.encode("hello") == _reference(d, "hello", specials=True)
    with pytest.raises(ChatError) as e:
        path.encode_chat([{"role": "user", "content": "x"}])
    assert e.value.code == "no_chat_template"


WHITESPACE_CASES = [
    ("string", [{"role": "user", "content": "hi  there"}], "user: hi  there"),
    (
        "parts-and-system",
        [{"role": "system", "content": "be brief"}, {"role": "user", "content": TEXT_PARTS}],
        "system: be brief\nuser: hello there be brief",
    ),
]


@pytest.mark.parametrize(
    ("messages", "text"), [c[1:] for c in WHITESPACE_CASES], ids=[c[0] for c in WHITESPACE_CASES]
)
@pytest.mark.parametrize("tenant", ["", "acme"], ids=["no-tenant", "tenant"])
def test_whitespace_default_keeps_todays_ids_and_hashes(
    messages: list[dict[str, Any]], text: str, tenant: str
) -> None:
    path = TokenPath()
    assert isinstance(path.tokenizer, WhitespaceTokenizer) and path.scheme == "tideserve"
    assert chat_prompt(messages) == text
    ids = path.encode_chat(messages)
    assert ids == tokenize(text) == list(api.parse_chat({"messages": messages}, 8).prompt_ids)
    assert path.block_hashes(ids * 8, 4, tenant=tenant) == block_hashes(ids * 8, 4, tenant=tenant)
