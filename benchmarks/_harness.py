"""Process helpers shared by the benchmark scripts (not part of the ``services`` package).

Everything binds 127.0.0.1 on free ephemeral ports. Child processes are started by
:class:`ProcGroup`, which owns them: ``stop()`` terminates (then kills) exactly the processes
it started, never anything found by name.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT.parent / "shared" / "traces"
MOONCAKE_CONVERSATION = TRACES / "mooncake_conversation_trace.jsonl"
SGLANG_ROUTER_VERSION = "0.3.2"


def _exit_143(signum: int, frame: object) -> None:
    sys.exit(128 + signal.SIGTERM)


def unwind_on_sigterm() -> None:
    """Make SIGTERM (a ``timeout``, a ``kill``) unwind the main thread like an exception.

    ``finally`` blocks then stop the processes a script started instead of orphaning them.
    Only SIGTERM's default action is replaced, and only from the main thread (where Python
    runs signal handlers); a handler the script installed itself is kept.
    """
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _exit_143)


def run_child(cmd: Sequence[str], stop_timeout_s: float = 120.0, **popen: Any) -> int:
    """Run ``cmd`` to its end and return its exit code.

    If this process is unwound meanwhile (SIGTERM, Ctrl-C, an error), the child gets SIGTERM
    and up to ``stop_timeout_s`` to stop what it started itself, then SIGKILL.
    ``subprocess.run`` would SIGKILL it at once, orphaning its own children.
    """
    with subprocess.Popen(list(cmd), **popen) as proc:
        try:
            return proc.wait()
        except BaseException:
            proc.terminate()
            try:
                proc.wait(timeout=stop_timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            raise


def free_port() -> int:
    """A currently free TCP port on 127.0.0.1 (the OS's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tideserve(*args: str) -> list[str]:
    """Command line of the ``tideserve`` CLI run by this interpreter (the project venv)."""
    return [sys.executable, "-m", "services.cli", *args]


def has_verb(verb: str) -> bool:
    """Whether ``tideserve <verb> --help`` exists (a helper's command may not have landed)."""
    done = subprocess.run(tideserve(verb, "--help"), cwd=ROOT, capture_output=True, timeout=60)
    return done.returncode == 0


@dataclass
class Child:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    handle: IO[bytes]

    def tail(self, chars: int = 2000) -> str:
        self.handle.flush()
        return self.log.read_text(errors="replace")[-chars:]


@dataclass
class ProcGroup:
    """Processes started by one benchmark phase, with their logs in ``log_dir``.

    Creating one makes SIGTERM unwind the script (:func:`unwind_on_sigterm`), so a ``finally``
    that calls :meth:`stop` runs when the script is killed too.
    """

    log_dir: Path
    children: list[Child] = field(default_factory=list)

    def __post_init__(self) -> None:
        unwind_on_sigterm()

    def start(self, name: str, cmd: Sequence[str], env: dict[str, str] | None = None) -> Child:
        log = self.log_dir / f"{name}.log"
        handle = log.open("ab")
        handle.write(f"$ {shlex.join(cmd)}\n".encode())
        handle.flush()
        full_env = None if env is None else {**os.environ, **env}
        proc = subprocess.Popen(
            list(cmd), cwd=ROOT, stdout=handle, stderr=subprocess.STDOUT, env=full_env
        )
        child = Child(name, proc, log, handle)
        self.children.append(child)
        return child

    def check(self) -> None:
        """Raise RuntimeError (with its log tail) if any child has exited."""
        for c in self.children:
            if c.proc.poll() is not None:
                raise RuntimeError(f"{c.name} exited with code {c.proc.returncode}:\n{c.tail()}")

    def pids(self) -> list[int]:
        return [c.proc.pid for c in self.children if c.proc.poll() is None]

    def stop(self, timeout_s: float = 10.0) -> None:
        for c in self.children:
            if c.proc.poll() is None:
                c.proc.terminate()
        for c in self.children:
            try:
                c.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                c.proc.kill()
                c.proc.wait()
            c.handle.close()
        self.children.clear()


def http_get(url: str, timeout_s: float = 2.0) -> tuple[int, bytes]:
    """(status, body) of a GET; status 0 when the connection failed."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return int(resp.status), resp.read()
    except urllib.error.HTTPError as err:
        return int(err.code), err.read()
    except (OSError, ValueError):
        return 0, b""


def wait_http(url: str, group: ProcGroup, timeout_s: float = 60.0) -> bytes:
    """Poll ``url`` until it answers 200; RuntimeError when a child dies or on timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        group.check()
        status, body = http_get(url)
        if status == 200:
            return body
        time.sleep(0.2)
    raise RuntimeError(f"{url} not answering 200 after {timeout_s:g}s")


class CpuMeter:
    """User+system CPU seconds used by a set of processes (and their children) over a span."""

    def __init__(self, pids: Sequence[int]) -> None:
        self._procs: list[psutil.Process] = []
        for pid in pids:
            with contextlib.suppress(psutil.Error):
                self._procs.append(psutil.Process(pid))
        self._start_wall = time.monotonic()
        self._start = self._total()

    def _total(self) -> float:
        total = 0.0
        for p in self._procs:
            with contextlib.suppress(psutil.Error):
                t = p.cpu_times()
                total += t.user + t.system + t.children_user + t.children_system
                for ch in p.children(recursive=True):
                    with contextlib.suppress(psutil.Error):
                        ct = ch.cpu_times()
                        total += ct.user + ct.system
        return total

    def read(self) -> dict[str, float]:
        """``cpu_s`` used since construction and ``percent_of_one_core`` over the wall span."""
        wall = max(time.monotonic() - self._start_wall, 1e-9)
        used = self._total() - self._start
        return {"cpu_s": round(used, 2), "percent_of_one_core": round(100.0 * used / wall, 1)}


class MachineCpu:
    """Cores the whole machine kept busy over a span (every process, ours included).

    Next to a measured process's own CPU it tells a saturated process from a starved one: a
    router at 50 % of a core whose latency grows while the machine is at 2.0 of 2 cores
    was waiting for a CPU, not for I/O (the kernel's run-queue delay, ``/proc/<pid>/schedstat``,
    reads 0 in this sandbox)."""

    def __init__(self) -> None:
        self._start_wall = time.monotonic()
        self._start = self._busy()

    @staticmethod
    def _busy() -> float:
        t = psutil.cpu_times()
        return float(sum(t)) - t.idle - getattr(t, "iowait", 0.0)

    def read(self) -> float:
        wall = max(time.monotonic() - self._start_wall, 1e-9)
        return round((self._busy() - self._start) / wall, 2)


def sglang_router_python(
    version: str = SGLANG_ROUTER_VERSION, install: bool = True
) -> tuple[Path | None, str]:
    """Python of a throwaway venv with ``sglang-router==version`` (never a project dependency).

    The venv lives at ``<tmp>/tideserve-sglang-router-<version>`` (the same cache the engine's
    e2e test uses). Returns ``(python, "")`` or ``(None, reason)`` when it is absent and
    ``install`` is false or the install failed.
    """
    venv = Path(tempfile.gettempdir()) / f"tideserve-sglang-router-{version}"
    python = venv / "bin" / "python"
    probe = [str(python), "-c", "import sglang_router"]
    if python.exists() and subprocess.run(probe, capture_output=True).returncode == 0:
        return python, ""
    if not install:
        return None, f"no venv with sglang-router at {venv}"
    partial = venv.with_name(venv.name + f".partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        subprocess.run(
            [sys.executable, "-m", "venv", str(partial)], check=True, capture_output=True
        )
        done = subprocess.run(
            [str(partial / "bin" / "python"), "-m", "pip", "install", "-q",
             f"sglang-router=={version}"],
            capture_output=True, text=True, timeout=900,
        )  # fmt: skip
    except (subprocess.SubprocessError, OSError) as err:
        shutil.rmtree(partial, ignore_errors=True)
        return None, f"cannot create a venv for sglang-router: {err}"
    if done.returncode != 0:
        shutil.rmtree(partial, ignore_errors=True)
        tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        return None, f"pip install sglang-router=={version} failed: {tail}"
    shutil.rmtree(venv, ignore_errors=True)
    partial.rename(venv)
    return python, ""


def machine() -> dict[str, object]:
    """What the figures were measured on: cores, load average before the run, git commit."""
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    )
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--", "services", "benchmarks"],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    return {
        "cores": psutil.cpu_count() or 0,
        "loadavg_1m_before": round(os.getloadavg()[0], 2),
        "python": sys.version.split()[0],
        "git_commit": head.stdout.strip() or None,
        "uncommitted_changes_in_services_or_benchmarks": bool(dirty.stdout.strip()),
    }


def emit_json(out: object, path: str | os.PathLike[str] | None) -> None:
    """Print a benchmark's JSON result on stdout and, when ``path`` is given, write it there."""
    text = json.dumps(out, indent=2)
    print(text)
    if path:
        Path(path).write_text(text + "\n", encoding="utf-8")


def command_line() -> str:
    """The command that produced this run, relative to the repo when possible."""
    return shlex.join([".venv/bin/python", *sys.argv])


def read_records(redis_url: str, stream: str, after: str) -> tuple[list[Any], str]:
    """The RequestRecords on ``stream`` after entry ``after``, and the last entry id."""
    import redis
    from tideserve.v1 import events_pb2

    from services.common.streams.codec import decode_entry

    client = redis.Redis.from_url(redis_url, decode_responses=False)
    out, last = [], after
    try:
        while True:
            batch = client.xrange(stream, min=f"({last}" if last != "-" else "-", count=1000)
            if not batch:
                return out, last
            for entry_id, fields in batch:
                out.append(decode_entry(fields, events_pb2.RequestRecord))
                last = entry_id.decode()
    finally:
        client.close()
