"""kvmeta's Transfer Engine metadata endpoint with token auth: writes need an operator."""

from __future__ import annotations

import time
from pathlib import Path

import aiohttp
import pytest

from services.common.errors import StartupError
from services.common.security.access import Role
from services.common.security.http import http_auth
from services.common.security.settings import AuthSettings
from services.common.security.tokens import format_entry, new_token
from services.kvmeta.access import METADATA_ACCESS
from services.kvmeta.metadata_http import MetadataServer

pytestmark = pytest.mark.asyncio

OPERATOR, READER = new_token(), new_token()

CASES = [
    ("PUT", None, False, 401),
    ("PUT", READER, False, 403),
    ("PUT", OPERATOR, False, 200),
    ("DELETE", READER, True, 403),
    ("GET", None, False, 401),
    ("GET", None, True, 404),  # open read: through to the store (key absent)
    ("GET", READER, False, 404),
    ("POST", OPERATOR, False, 403),  # a route in no table
]


@pytest.mark.parametrize(
    ("method", "token", "open_reads", "status"),
    CASES,
    ids=[f"{m}-{'op' if t == OPERATOR else 'ro' if t else 'none'}-open{o}" for m, t, o, _ in CASES],
)
async def test_metadata_writes_need_an_operator(
    tmp_path: Path, method: str, token: str | None, open_reads: bool, status: int
) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text(
        format_entry("op", Role.OPERATOR, OPERATOR) + "\n" + format_entry("ro", Role.READ, READER)
    )
    auth = AuthSettings(enabled=True, tokens_file=tokens, open_reads=open_reads)
    server = MetadataServer(
        "127.0.0.1", 0, middlewares=http_auth(auth, METADATA_ACCESS, time.monotonic)
    )
    await server.start()
    try:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        url = f"http://127.0.0.1:{server.bound_port}/metadata?key=k"
        async with aiohttp.ClientSession() as http:
            async with http.request(method, url, data=b"{}", headers=headers) as resp:
                assert resp.status == status
                if status in (401, 403):
                    assert "error" in await resp.json()
    finally:
        await server.stop()
    assert len(server.store) == (1 if (method, status) == ("PUT", 200) else 0)


async def test_unreadable_tokens_file_is_a_startup_error(tmp_path: Path) -> None:
    auth = AuthSettings(enabled=True, tokens_file=tmp_path / "missing")
    with pytest.raises(StartupError, match=r"auth\.tokens_file"):
        http_auth(auth, METADATA_ACCESS, time.monotonic)
