"""P/D between two ``tideserve engine`` processes with ``--kv-data-plane``: real KV bytes
cross process boundaries over the Mooncake Transfer Engine (TCP on loopback), found through
kvmeta's metadata endpoint (a child process). The decode answer reports the measured
transfer (``usage.kv_transfer_ms``, set only after every byte was verified). When the prefill
process is gone before the decode pulls, the decode recomputes: the same answer, no hang.
"""

from __future__ import annotations

import asyncio
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.helpers.dataplane import metadata_url_or_skip
from tests.helpers.ports import free_port
from tests.integration._engine_proc import engine_process

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

LONG = " ".join(f"w{i}" for i in range(700))


@pytest.fixture(scope="module")
def metadata_url() -> Iterator[str]:
    yield from metadata_url_or_skip()


async def _post(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> dict[str, Any]:
    async with http.post(url, json=body) as resp:
        assert resp.status == 200, await resp.text()
        out: dict[str, Any] = await resp.json()
        return out


async def _segment(http: aiohttp.ClientSession, metadata_url: str, name: str) -> int:
    key = urllib.parse.quote(f"mooncake/ram/{name}", safe="")
    async with http.get(f"{metadata_url}?key={key}") as resp:
        return resp.status


async def test_sglang_pair_of_processes_moves_and_verifies_bytes(
    tmp_path: Path, metadata_url: str, http: aiohttp.ClientSession
) -> None:
    dp = ("--kv-data-plane", "--te-metadata-url", metadata_url)
    boot = free_port()
    async with (
        engine_process(
            tmp_path / "p", "--role", "prefill", "--bootstrap-port", str(boot), *dp
        ) as purl,
        engine_process(tmp_path / "d", "--role", "decode", *dp) as durl,
    ):
        for url in (purl, durl):  # each engine's segment is registered in kvmeta
            assert await _segment(http, metadata_url, url.removeprefix("http://")) == 200
        body = {
            "prompt": LONG,
            "max_tokens": 4,
            "bootstrap_host": "127.0.0.1",
            "bootstrap_port": boot,
            "bootstrap_room": 9,
        }
        p_out, d_out = await asyncio.gather(
            _post(http, purl + "/v1/completions", body),
            _post(http, durl + "/v1/completions", body),
        )
        assert p_out["usage"]["completion_tokens"] == 1
        assert d_out["usage"]["completion_tokens"] == 4
        assert d_out["usage"]["kv_transfer_ms"] > 0


async def test_prefill_process_gone_before_the_pull_recomputes(
    tmp_path: Path, metadata_url: str, http: aiohttp.ClientSession
) -> None:
    dp = ("--kv-data-plane", "--te-metadata-url", metadata_url)
    async with engine_process(tmp_path / "a", *dp) as aurl:  # aggregated: the reference
        want = await _post(http, aurl + "/v1/completions", {"prompt": LONG, "max_tokens": 5})
    async with engine_process(tmp_path / "d", "--role", "decode", *dp) as durl:
        async with engine_process(tmp_path / "p", "--role", "prefill", *dp) as purl:
            p_body = {
                "prompt": LONG,
                "max_tokens": 1,
                "kv_transfer_params": {"do_remote_decode": True},
            }
            kv = (await _post(http, purl + "/v1/completions", p_body))["kv_transfer_params"]
            assert len(kv["tideserve_kv"]["addrs"]) == 10
        # the prefill process has exited: its segment is gone from kvmeta
        assert await _segment(http, metadata_url, purl.removeprefix("http://")) == 404
        body = {"prompt": LONG, "max_tokens": 5, "kv_transfer_params": kv}
        got = await _post(http, durl + "/v1/completions", body)
    assert got["choices"][0]["text"] == want["choices"][0]["text"]
    assert "kv_transfer_ms" not in got["usage"]
    assert got["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # all recomputed
