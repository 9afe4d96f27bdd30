"""One tokenization path in process: a simulated engine given a model directory reports the
prompt token counts the gateway computes with the same directory (aiohttp test server), and
the gRPC Pick API tokenizes and hashes ``prompt_text`` with the gateway's path."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from tideserve.v1 import scheduler_pb2

from services.common.routing.types import PrefixMatch, RequestView
from services.common.tokens import HashScheme, TokenPath, token_path
from services.scheduler.grpc.servicer import SchedulerServicer
from services.scheduler.http.openai import Kind, parse_request
from tests.helpers.engines import EngineFactory, EngineFleet
from tests.helpers.model_dir import write_model_dir
from tests.helpers.scheduler import scheduler_stub, two_workers


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model_dir(tmp_path_factory.mktemp("model"))


@pytest.fixture
async def make_engine(tmp_path: Path) -> AsyncIterator[EngineFactory]:
    fleet = EngineFleet(tmp_path, profile="test", speedup=50.0)
    yield fleet.start
    await fleet.close()


PARTS = [{"type": "text", "text": "hello there"}, {"type": "text", "text": "be brief"}]
CASES: list[tuple[str, Kind, str, dict[str, Any]]] = [
    (
        "chat-string",
        "chat",
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "hi"}]},
    ),
    (
        "chat-turns-and-parts",
        "chat",
        "/v1/chat/completions",
        {
            "messages": [
                {"role": "system", "content": "be brief and precise"},
                {"role": "user", "content": "how are you today?"},
                {"role": "assistant", "content": "fine"},
                {"role": "user", "content": PARTS},
            ]
        },
    ),
    ("completion", "completion", "/v1/completions", {"prompt": "the quick brown fox jumps"}),
    ("completion-list", "completion", "/v1/completions", {"prompt": ["the lazy dog"]}),
]


@pytest.mark.parametrize("with_model", [True, False], ids=["model", "whitespace"])
@pytest.mark.parametrize(
    ("kind", "path", "body"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
async def test_engine_reports_the_gateways_prompt_token_count(
    make_engine: EngineFactory,
    model_dir: Path,
    with_model: bool,
    kind: Kind,
    path: str,
    body: dict[str, Any],
) -> None:
    model_path = model_dir if with_model else None
    engine, url = await make_engine(model_path=model_path)
    raw = json.dumps({"model": "tideserve-sim", "max_tokens": 2, **body}).encode()
    tokens = token_path(model_path)
    parsed = parse_request(kind, raw, {}, models=(), classes=("agent",), tokens=tokens)
    async with aiohttp.ClientSession() as http, http.post(url + path, data=raw) as resp:
        assert resp.status == 200, await resp.text()
        usage = (await resp.json())["usage"]
    assert usage["prompt_tokens"] == len(parsed.prompt_ids)
    if with_model:
        # the counts really come from the model (not whitespace words), loaded once per dir
        ws = parse_request(kind, raw, {}, models=(), classes=("agent",))
        assert len(parsed.prompt_ids) != len(ws.prompt_ids)
        assert engine.tokens.tokenizer is tokens.tokenizer


async def test_engine_serves_the_model_directory_as_its_tokenizer_path(
    make_engine: EngineFactory, model_dir: Path
) -> None:
    _, url = await make_engine(model_path=model_dir)
    async with aiohttp.ClientSession() as http, http.get(url + "/server_info") as resp:
        info = await resp.json()
    assert info["model_path"] == info["tokenizer_path"] == str(model_dir)


@pytest.mark.parametrize("scheme", ["tideserve", "vllm", "sglang"])
@pytest.mark.parametrize("with_model", [True, False], ids=["model", "whitespace"])
async def test_grpc_pick_tokenizes_and_hashes_like_the_gateway(
    model_dir: Path, scheme: HashScheme, with_model: bool
) -> None:
    tokens = token_path(model_dir if with_model else None, scheme)
    seen: list[RequestView] = []

    async def lookup(view: RequestView, *_: str) -> dict[str, PrefixMatch] | None:
        seen.append(view)
        return None

    text = "routing requests to the engine that already holds the prefix saves prefill time"
    servicer = SchedulerServicer(
        two_workers(), deployment="d", block_size=4, prefix_lookup=lookup, tokens=tokens
    )
    async with scheduler_stub(servicer) as stub:
        await stub.Pick(scheduler_pb2.PickRequest(deployment="d", prompt_text=text))
    ids = tokens.encode(text)
    (view,) = seen
    assert view.prompt_tokens == len(ids)
    assert view.block_hashes == tuple(tokens.block_hashes(ids, 4)) != ()
    default = TokenPath()
    differs = view.block_hashes != tuple(default.block_hashes(default.encode(text), 4))
    assert differs == (scheme != "tideserve" or with_model)
