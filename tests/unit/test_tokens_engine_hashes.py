"""The gateway's block hashes for a chat request equal the hashes in a real engine's KV events.

A gateway built from settings with ``model_path`` and ``hash_scheme`` parses a chat request;
the "engine" side renders the same conversation with the model's chat template, tokenizes it
with the ``tokenizers`` library, hashes the blocks as vLLM / SGLang do (written out here from
the engines' algorithms, independently of ``services.common.tokens.hashing``), and publishes
them in its wire format (``tests/unit/_kv_bridge_helpers``); the bridge decodes and translates
them. Both sides must name the same blocks.
"""

from __future__ import annotations

import hashlib
import json
import pickle
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer as HFTokenizer

from services.common.tokens import HashScheme
from services.common.tokens.hashing import index_tenant, vllm_block_hashes
from services.kvbridge.translate import TranslateConfig, translate_events
from services.kvbridge.wire import Engine, decode_batch
from services.scheduler.http.openai import intake_of, parse_request
from services.scheduler.main import build_gateway
from services.scheduler.settings import SchedulerSettings
from tests.helpers.model_dir import write_model_dir
from tests.unit._kv_bridge_helpers import (
    SGLANG_BATCH,
    SGLANG_STORED,
    as_array,
    pack,
    vllm_payload,
    vllm_stored,
)

BLOCK = 4
MESSAGES = [
    {"role": "system", "content": "be brief and precise"},
    {"role": "user", "content": "how are you today?"},
    {"role": "assistant", "content": "I am fine, thank you."},
    {
        "role": "user",
        "content": [
            {"type": "text", "text": "routing requests to the engine"},
            {"type": "text", "text": "saves prefill time"},
        ],
    },
]


def _rendered(part_sep: str) -> str:
    """The conversation as the engine's chat template renders it (the helper's template)."""
    out = "<s>"
    for m in MESSAGES:
        c = m["content"]
        text = c if isinstance(c, str) else part_sep.join(p["text"] for p in c)
        out += f"<|{m['role']}|>\n{text.strip()}</s>\n"
    return out + "<|assistant|>\n"


def _vllm_digests(ids: list[int], salt: str) -> list[bytes]:
    parent = hashlib.sha256(pickle.dumps("vllm-none-hash", protocol=5)).digest()
    digests = []
    for i in range(len(ids) // BLOCK):
        extra = (("cache_salt", salt),) if (i == 0 and salt) else None
        key = (parent, tuple(ids[i * BLOCK : (i + 1) * BLOCK]), extra)
        digests.append(parent := hashlib.sha256(pickle.dumps(key, protocol=5)).digest())
    return digests


def _sglang_signed(ids: list[int]) -> list[int]:
    prev, out = b"", []
    for i in range(len(ids) // BLOCK):
        page = b"".join(t.to_bytes(4, "little") for t in ids[i * BLOCK : (i + 1) * BLOCK])
        prev = hashlib.sha256(prev + page).digest()
        out.append(int.from_bytes(prev[:8], "big", signed=True))  # hash_str_to_int64
    return out


def _engine_event_hashes(wire: str, ids: list[int], salt: str) -> tuple[int, ...]:
    """Hashes of the engine's BlockStored for ``ids``, after the bridge's decode+translate."""
    full = ids[: len(ids) // BLOCK * BLOCK]
    if wire.startswith("vllm"):
        digests = _vllm_digests(ids, salt)
        hashes: list[Any] = (
            digests if wire == "vllm-bytes" else [int.from_bytes(d[-8:], "big") for d in digests]
        )
        stored = vllm_stored(
            hashes, tokens=full, block_size=BLOCK, as_map_encoding=wire == "vllm-map"
        )
        batch = decode_batch(vllm_payload([stored]), Engine.VLLM)
    else:
        stored = as_array(
            "BlockStored",
            SGLANG_STORED,
            block_hashes=_sglang_signed(ids),
            parent_block_hash=None,
            token_ids=full,
            block_size=BLOCK,
            lora_id=None,
            medium="GPU",
        )
        payload = pack(as_array(None, SGLANG_BATCH, ts=1.0, events=[stored]))
        batch = decode_batch(payload, Engine.SGLANG)
    (event,), _ = translate_events(batch, TranslateConfig("d", "w0"))
    return tuple(event.block_hashes)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model_dir(tmp_path_factory.mktemp("model"))


CASES: list[tuple[str, HashScheme, str, str, str]] = [
    # id, scheme, wire form, cache_salt, how the engine joins text parts
    ("vllm-int-ids", "vllm", "vllm-int", "", "\n"),
    ("vllm-bytes-ids", "vllm", "vllm-bytes", "", "\n"),
    ("vllm-map-encoding", "vllm", "vllm-map", "", "\n"),
    ("vllm-cache-salt", "vllm", "vllm-int", "acme", "\n"),
    ("sglang-signed-int64", "sglang", "sglang", "", " "),
    ("sglang-ignores-salt", "sglang", "sglang", "acme", " "),
]


@pytest.mark.parametrize(
    ("scheme", "wire", "salt", "part_sep"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_gateway_hashes_equal_engine_kv_event_hashes(
    model_dir: Path, scheme: HashScheme, wire: str, salt: str, part_sep: str
) -> None:
    settings = SchedulerSettings(
        model_path=model_dir, hash_scheme=scheme, block_size=BLOCK, http_port=0, grpc_port=0
    )
    _, gateway = build_gateway(settings)
    body: dict[str, Any] = {"model": "m", "messages": MESSAGES}
    if salt:
        body["cache_salt"] = salt
    parsed = parse_request(
        "chat",
        json.dumps(body).encode(),
        {},
        models=(),
        classes=[c.name for c in settings.slo_classes],
        tokens=gateway.opts.tokens,
    )
    engine_ids = list(
        HFTokenizer.from_file(str(model_dir / "tokenizer.json"))
        .encode(_rendered(part_sep), add_special_tokens=False)
        .ids
    )
    assert list(parsed.prompt_ids) == engine_ids
    view = intake_of("r1", parsed, gateway.opts.tokens, gateway.opts.block_size)
    assert len(view.block_hashes) == len(engine_ids) // BLOCK >= 8
    assert view.block_hashes == _engine_event_hashes(wire, engine_ids, salt)


def test_default_gateway_hashes_are_the_simulators_not_an_engines(model_dir: Path) -> None:
    _, gateway = build_gateway(SchedulerSettings(block_size=BLOCK, http_port=0, grpc_port=0))
    assert gateway.opts.tokens.scheme == "tideserve"
    ids = list(range(64))
    assert not set(gateway.opts.tokens.block_hashes(ids, BLOCK)) & set(
        _engine_event_hashes("vllm-int", ids, "")
    )


# Computed by vLLM 0.32 itself (``vllm.v1.core.kv_cache_utils.hash_block_tokens`` with its
# sha256 and ``init_none_hash``), low 64 bits, blocks of 4 tokens of [1..8].
VLLM_032_VECTORS = [
    ("", None),
    ("acme", [3974403086984758162, 17933253122984951119]),
]


@pytest.mark.parametrize(("salt", "expected"), VLLM_032_VECTORS, ids=["plain", "salted"])
def test_vllm_hashes_equal_vllm_032(salt: str, expected: list[int] | None) -> None:
    got = vllm_block_hashes(list(range(1, 9)), 4, cache_salt=salt)
    if expected is None:  # plain: no extra key at all
        parent = hashlib.sha256(pickle.dumps("vllm-none-hash", protocol=5)).digest()
        first = hashlib.sha256(pickle.dumps((parent, (1, 2, 3, 4), None), protocol=5)).digest()
        expected = [int.from_bytes(first, "big") & (2**64 - 1)]
        assert got[:1] == expected
    else:
        assert got == expected


@pytest.mark.parametrize(
    ("scheme", "salt", "tenant"),
    [
        ("tideserve", "acme", "acme"),
        ("vllm", "acme", ""),
        ("sglang", "acme", ""),
        ("vllm", "", ""),
    ],
    ids=["simulator-stamps-salt", "vllm-salt-in-hash", "sglang-no-salt", "vllm-plain"],
)
def test_index_tenant(scheme: HashScheme, salt: str, tenant: str) -> None:
    assert index_tenant(scheme, salt) == tenant
