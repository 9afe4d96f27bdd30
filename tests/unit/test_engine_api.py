"""Pure request parsing and event translation of the engine simulator."""

from __future__ import annotations

from typing import Any

import pytest
from tideserve.v1 import common_pb2, events_pb2

from services.common.engine_core.kvcache import KVEventKind, KVEventRecord
from services.common.tokens import tokenize
from services.engine import api
from services.engine.events import kv_batch


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


@pytest.mark.parametrize(
    ("kv", "expect"),
    [
        (
            {
                "do_remote_decode": True,
                "do_remote_prefill": False,
                "remote_engine_id": None,
                "remote_block_ids": None,
                "remote_host": None,
                "remote_port": None,
            },
            api.KVTransferParams(do_remote_decode=True),
        ),
        (
            {
                "do_remote_prefill": True,
                "remote_engine_id": "p1",
                "remote_request_id": "r",
                "remote_block_ids": [0, 1, 2],
                "remote_host": "10.0.0.1",
                "remote_port": 8100,
                "tp_size": 2,
            },
            api.KVTransferParams(False, True, "p1", "r", (0, 1, 2), "10.0.0.1", 8100, 2),
        ),
        (
            {"do_remote_prefill": True, "remote_block_ids": [[4, 5], [6]], "remote_tp_size": "4"},
            api.KVTransferParams(do_remote_prefill=True, remote_block_ids=(4, 5, 6), tp_size=4),
        ),
    ],
    ids=["prefill-request-as-the-toy-proxy-sends-it", "decode-request", "grouped-block-ids"],
)
def test_kv_transfer_params_are_read(kv: dict[str, Any], expect: api.KVTransferParams) -> None:
    for parse, body in (
        (api.parse_completion, {"prompt": "a b"}),
        (api.parse_chat, {"messages": [{"role": "user", "content": "x"}]}),
        (api.parse_generate, {"text": "a b"}),
    ):
        assert parse({**body, "kv_transfer_params": kv}, 8).kv_transfer == expect


@pytest.mark.parametrize(
    ("kv", "param"),
    [
        ("yes", "kv_transfer_params"),
        ({"remote_block_ids": ["a"]}, "kv_transfer_params"),
        ({"do_remote_decode": "true"}, "do_remote_decode"),
        ({"remote_port": "8100"}, "remote_port"),
    ],
    ids=["not-an-object", "block-ids-strings", "flag-string", "port-string"],
)
def test_bad_kv_transfer_params_are_refused(kv: Any, param: str) -> None:
    with pytest.raises(api.BadRequest) as err:
        api.parse_completion({"prompt": "a", "kv_transfer_params": kv}, 8)
    assert err.value.param == param
