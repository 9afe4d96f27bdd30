"""Embedded Postgres and Redis: they start, answer, persist, and stop without leftovers."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import psycopg
import pytest
import redis

from services.common.embedded import (
    EmbeddedStartError,
    start_postgres,
    start_redis,
    stop_postgres_dir,
)


def _processes_using(path: Path) -> list[int]:
    """Live processes whose command line or working directory is inside ``path``
    (postgres backends rewrite their command line but keep cwd = pgdata)."""
    needle = str(path)
    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "cwd", "status"]):
        cmd = " ".join(proc.info["cmdline"] or [])
        cwd = proc.info["cwd"] or ""
        if proc.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        if needle in cmd or cwd.startswith(needle):
            found.append(proc.info["pid"])
    return found


@pytest.fixture
def data_dir() -> Iterator[Path]:
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


OWNER = """
import signal, sys, threading
from pathlib import Path
from services.common.embedded import start_postgres, start_redis
root = Path(sys.argv[1])
pg = start_postgres(root / "pg")
rd = start_redis(root / "redis", 0)
done = threading.Event()
signal.signal(signal.SIGINT, lambda *_: done.set())
print(pg.pid, rd.pid, flush=True)
done.wait()
rd.stop()
pg.stop()
"""


def _start_owner(data_dir: Path) -> tuple[subprocess.Popen[str], list[int]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(data_dir)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    pids = [int(p) for p in proc.stdout.readline().split()]
    assert len(pids) == 2, "owner did not start both servers"
    return proc, pids


def test_owner_process_stops_both_servers_on_ctrl_c(data_dir: Path) -> None:
    proc, pids = _start_owner(data_dir)
    assert all(psutil.pid_exists(p) for p in pids)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 0
    assert _processes_using(data_dir) == []


def test_postgres_left_by_a_killed_owner_is_stopped_by_stop_postgres_dir(data_dir: Path) -> None:
    proc, (pg_pid, redis_pid) = _start_owner(data_dir)
    proc.kill()
    proc.wait(timeout=30)
    os.kill(redis_pid, signal.SIGTERM)  # the stack's `down` does this from its pid file
    assert psutil.pid_exists(pg_pid)
    assert stop_postgres_dir(data_dir / "pg") is True
    assert stop_postgres_dir(data_dir / "pg") is False
    # wait_procs takes Process objects (a bare pid failed whenever Redis was still exiting)
    with contextlib.suppress(psutil.NoSuchProcess):
        psutil.wait_procs([psutil.Process(redis_pid)], timeout=15)
    assert _processes_using(data_dir) == []
