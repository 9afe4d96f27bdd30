"""Pure request parsing and event translation of the engine simulator."""

from __future__ import annotations

from typing import Any

import pytest
from tideserve.v1 import common_pb2, events_pb2

from services.common.tokens import tokenize
from services.engine import api
from services.engine.events import kv_batch
from services.engine.kvcache import KVEventKind, KVEventRecord


def test_chat_template_is_role_colon_content_lines() -> None:
    msgs = [
        {"role": "system", "content": "be brief"},
        {
            "role": "user",
            "content": [{"type": "text", "text": "hi"}, {"type": "text", "text": "there"}],
        },
    ]
    assert api.chat_prompt(msgs) == "system: be brief\nuser: hi there"
    req = api.parse_chat({"messages": msgs, "max_completion_tokens": 7}, 128)
    assert req.prompt_ids == tuple(tokenize("system: be brief\nuser: hi there"))
    assert req.max_new_tokens == 7


@pytest.mark.parametrize(
    ("body", "expect"),
    [
        ({"prompt": "a b", "max_tokens": 3}, (2, 3, False, "")),
        ({"prompt": [5, 6, 7]}, (3, 128, False, "")),
        ({"prompt": "a", "stream": True, "cache_salt": "acme"}, (1, 128, True, "acme")),
    ],
    ids=["text", "token-ids-default-max", "stream-and-salt"],
)
def test_parse_completion(body: dict[str, Any], expect: tuple[int, int, bool, str]) -> None:
    r = api.parse_completion(body, 128)
    assert (len(r.prompt_ids), r.max_new_tokens, r.stream, r.tenant) == expect


def test_bootstrap_fields_are_read() -> None:
    r = api.parse_generate(
        {"text": "x", "bootstrap_host": "10.0.0.1", "bootstrap_port": 8998, "bootstrap_room": 7}, 1
    )
    assert r.bootstrap == api.Bootstrap("10.0.0.1", 8998, 7)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt": "a", "max_tokens": True}, "max_tokens"),
        ({"prompt": "a", "n": 2}, "n"),
        ({"prompt": ""}, "prompt"),
        ({"prompt": "a", "cache_salt": 3}, "cache_salt"),
        ({"prompt": "a", "bootstrap_room": "r"}, "bootstrap_room"),
    ],
    ids=["bool-max-tokens", "n-2", "empty-prompt", "salt-int", "room-string"],
)
def test_bad_fields_name_the_param(body: dict[str, Any], param: str) -> None:
    with pytest.raises(api.BadRequest) as err:
        api.parse_completion(body, 16)
    assert err.value.param == param


def test_kv_batch_translates_records() -> None:
    records = [
        KVEventRecord(KVEventKind.STORED, (11, 12), 10, 128, "t"),
        KVEventRecord(KVEventKind.REMOVED, (11,), 0, 64),
        KVEventRecord(KVEventKind.ALL_CLEARED),
    ]
    b = kv_batch(records, deployment="d", instance_id="i", epoch=5, seq=3, ts_ms=9, block_size=64)
    assert (b.deployment, b.instance_id, b.epoch, b.seq, b.block_size) == ("d", "i", 5, 3, 64)
    kinds = [e.kind for e in b.events]
    assert kinds == [
        events_pb2.KVEvent.KIND_BLOCK_STORED,
        events_pb2.KVEvent.KIND_BLOCK_REMOVED,
        events_pb2.KVEvent.KIND_ALL_CLEARED,
    ]
    stored = b.events[0]
    assert list(stored.block_hashes) == [11, 12] and stored.parent_hash == 10
    assert stored.tier == common_pb2.TIER_GPU and stored.token_count == 128 and stored.tenant == "t"
