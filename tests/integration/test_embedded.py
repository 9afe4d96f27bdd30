"""Embedded Postgres and Redis: they start, answer, persist, and stop without leftovers."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import psutil
import psycopg
import pytest
import redis

from services.common.embedded import EmbeddedStartError, start_postgres, start_redis


def _processes_using(path: Path) -> list[int]:
    needle = str(path)
    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        cmd = " ".join(proc.info["cmdline"] or [])
        if needle in cmd and proc.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(proc.info["pid"])
    return found


@pytest.fixture
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    import shutil
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="tideserve-emb-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_postgres_start_query_stop_restart_keeps_data(data_dir: Path) -> None:
    server = start_postgres(data_dir)
    try:
        with psycopg.connect(server.url, autocommit=True) as conn:
            conn.execute("CREATE TABLE kept (v int)")
            conn.execute("INSERT INTO kept VALUES (42)")
    finally:
        server.stop()
    assert not psutil.pid_exists(server.pid) or _processes_using(data_dir) == []
    assert _processes_using(data_dir) == []

    again = start_postgres(data_dir)
    try:
        with psycopg.connect(again.url) as conn:
            row = conn.execute("SELECT v FROM kept").fetchone()
        assert row == (42,)
    finally:
        again.stop()
        again.stop()  # idempotent
    assert _processes_using(data_dir) == []


def test_redis_start_persists_with_aof_and_stop_leaves_nothing(data_dir: Path) -> None:
    server = start_redis(data_dir, 0)
    try:
        client = redis.Redis.from_url(server.url)
        client.xadd("s", {"k": b"v"})
        client.close()
        assert psutil.Process(server.pid).is_running()
    finally:
        server.stop()
    assert _processes_using(data_dir) == []
    assert (data_dir / "redis.log").exists()

    again = start_redis(data_dir, server.port)
    try:
        client = redis.Redis.from_url(again.url)
        assert client.xlen("s") == 1
        client.close()
    finally:
        again.stop()
    assert _processes_using(data_dir) == []


def test_redis_port_in_use_fails_with_one_line_and_no_process(data_dir: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(EmbeddedStartError) as info:
            start_redis(data_dir, port)
    assert str(port) in str(info.value)
    assert "\n" not in str(info.value)
    assert _processes_using(data_dir) == []
