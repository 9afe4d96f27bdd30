"""Prefill/decode disaggregation with real vLLM: two instances with vLLM's ``ExampleConnector``
(KV written to and read from a shared directory: the KV connector that works on the CPU
build), the gateway's ``vllm`` P/D flow in front (prefill with ``max_tokens=1``, then the
request on the decode instance). The decode instance computes only what the prefill did not
hand over."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from tests.helpers.vllm import MODEL_NAME, VLLMServer
from tests.real_engines._front import front, instance_id


@pytest.fixture(scope="module")
def pd_pair(
    vllm_py: Path, real_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[VLLMServer, VLLMServer]]:
    logs = tmp_path_factory.mktemp("vllm-pd-logs")
    config = json.dumps(
        {
            "kv_connector": "ExampleConnector",
            "kv_role": "kv_both",
            "kv_connector_extra_config": {"shared_storage_path": str(logs / "kv")},
        }
    )
    pair = [
        VLLMServer(
            vllm_py, real_model, logs, name=name, extra_args=("--kv-transfer-config", config)
        )
        for name in ("prefill", "decode")
    ]
    try:
        for s in pair:
            s.start()
        for s in pair:
            s.wait_ready()
        yield pair[0], pair[1]
    finally:
        for s in pair:
            s.stop()


async def test_decode_loads_the_prefills_kv(
    pd_pair: tuple[VLLMServer, VLLMServer], redis_url: str, real_model: Path
) -> None:
    prefill, decode = pd_pair
    text = " ".join(f"part{i} of a long shared context" for i in range(40))
    body = {
        "model": MODEL_NAME,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": 4,
    }
    async with front(
        [prefill, decode],
        redis_url,
        real_model,
        endpoint_roles=("prefill", "decode"),
        pd_protocol="vllm",
        # every long prompt disaggregated (the default decider would price this one against
        # the idle decode engine, which computes it no slower)
        profile="threshold",
    ) as f:
        async with (
            aiohttp.ClientSession() as http,
            http.post(f.url + "/v1/chat/completions", json=body) as r,
        ):
            answer = await r.json(content_type=None)
            assert r.status == 200, answer
        (record,) = await f.records(1)
    prompt = answer["usage"]["prompt_tokens"]
    loaded = answer["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert record.disaggregated
    assert (record.prefill_instance, record.decode_instance) == (
        instance_id(prefill),
        instance_id(decode),
    )
    assert answer["usage"]["completion_tokens"] == 4
    # the connector hands over whole blocks (and never the last token): at least one block
    assert prompt > 2 * 128 and 128 <= loaded < prompt and loaded % 128 == 0
