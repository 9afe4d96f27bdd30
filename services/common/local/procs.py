"""Process supervision: start children with their logs, tell if a pid is still ours, stop.

A process is identified by pid *and* start time (:class:`ProcRef`) so a recycled pid is never
signalled by mistake.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from services.common.local.spec import ChildSpec

_CREATE_TIME_SLACK_S = 0.05
# A start time this large is seconds since the epoch (records written before start times
# were taken from boot): compared as such, with a second of slack.
_EPOCH_LIKE_S = 1e9
_EPOCH_SLACK_S = 1.0


def started_after_boot(proc: psutil.Process) -> float:
    """When ``proc`` started, in seconds after boot. The kernel keeps a process's start in
    clock ticks since boot; psutil adds the boot time (``btime``, the wall clock less the
    uptime), which moves whenever the wall clock is stepped or slewed (NTP), so its epoch
    create time of one process drifts. Taking the boot time off again gives the tick count's
    value, which never changes."""
    return proc.create_time() - psutil.boot_time()


@dataclass(frozen=True)
class ProcRef:
    """A process we started (or were told about): name, pid, and ``create_time``, its start
    in seconds after boot (:func:`started_after_boot`)."""

    name: str
    pid: int
    create_time: float | None = None

    @classmethod
    def of(cls, name: str, pid: int) -> ProcRef:
        """Reference ``pid`` as it is now (create_time None when it is already gone)."""
        try:
            return cls(name, pid, started_after_boot(psutil.Process(pid)))
        except psutil.Error:
            return cls(name, pid, None)


def same_start(proc: psutil.Process, create_time: float) -> bool:
    """Whether ``proc`` is the process that started at ``create_time`` (see :class:`ProcRef`)."""
    if create_time >= _EPOCH_LIKE_S:
        return abs(proc.create_time() - create_time) <= _EPOCH_SLACK_S
    return abs(started_after_boot(proc) - create_time) <= _CREATE_TIME_SLACK_S


def _process(ref: ProcRef) -> psutil.Process | None:
    """The live process behind ``ref``, or None if it is gone, a zombie, or a recycled pid."""
    try:
        proc = psutil.Process(ref.pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        if ref.create_time is not None and not same_start(proc, ref.create_time):
            return None
        return proc
    except psutil.Error:
        return None


def is_alive(ref: ProcRef) -> bool:
    """True while the very process ``ref`` names runs (zombies count as gone)."""
    return _process(ref) is not None


def signal_process(ref: ProcRef, sig: int = signal.SIGTERM) -> bool:
    """Send ``sig`` to ``ref`` if it is still that process; True when sent."""
    proc = _process(ref)
    if proc is None:
        return False
    try:
        proc.send_signal(sig)
    except psutil.Error:
        return False
    return True


def stop_processes(refs: Sequence[ProcRef], timeout_s: float) -> list[ProcRef]:
    """SIGTERM every live process in ``refs``, wait up to ``timeout_s`` for all of them, then
    SIGKILL what is left. Returns the refs that had to be killed. Idempotent: gone processes are
    skipped. Reaps them when they are our children.
    """
    procs: dict[int, tuple[ProcRef, psutil.Process]] = {}
    for ref in refs:
        proc = _process(ref)
        if proc is None:
            continue
        try:
            proc.terminate()
        except psutil.Error:
            continue
        procs[proc.pid] = (ref, proc)
    if not procs:
        return []
    _, alive = psutil.wait_procs([p for _, p in procs.values()], timeout=timeout_s)
    alive = [p for p in alive if _process(procs[p.pid][0]) is not None]
    killed: list[ProcRef] = []
    for proc in alive:
        try:
            proc.kill()
        except psutil.Error:
            continue
        killed.append(procs[proc.pid][0])
    if alive:
        psutil.wait_procs(alive, timeout=5.0)
    return killed


def log_tail(path: Path, lines: int = 15) -> str:
    """The last ``lines`` lines of a log file ("" when missing)."""
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 16_384))
            data = fh.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(data.splitlines()[-lines:])


def _one_wave(kind: str) -> int:
    return 0


@dataclass
class Child:
    """A started child: its spec, Popen handle and identity."""

    spec: ChildSpec
    popen: subprocess.Popen[bytes]
    ref: ProcRef

    def exit_code(self) -> int | None:
        """The exit code once it has exited, else None (reaps it)."""
        return self.popen.poll()


class Supervisor:
    """Starts children (each in its own session, output to its log file) and stops them all.

    Children get their own session so a terminal Ctrl-C reaches only their owner (e.g.
    ``tideserve up``), which then stops them in order: ``stop_rank`` maps a child's ``kind``
    to its wave (lower first; default: one wave).
    """

    def __init__(
        self, stop_timeout_s: float = 10.0, stop_rank: Callable[[str], int] | None = None
    ) -> None:
        self.stop_timeout_s = stop_timeout_s
        self._stop_rank: Callable[[str], int] = stop_rank or _one_wave
        self._children: list[Child] = []

    @property
    def children(self) -> tuple[Child, ...]:
        return tuple(self._children)

    def start(self, spec: ChildSpec, *, replacing: Child | None = None) -> Child:
        """Start ``spec``; raises OSError when the executable cannot be started. With
        ``replacing`` (an exited child), the new process takes its place and appends to
        its log."""
        spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        with spec.log_path.open("ab" if replacing is not None else "wb") as log:
            popen = subprocess.Popen(
                list(spec.argv),
                env=dict(spec.env),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
            )
        child = Child(spec, popen, ProcRef.of(spec.name, popen.pid))
        if replacing is not None:
            self._children[self._children.index(replacing)] = child
        else:
            self._children.append(child)
        return child

    def exited(self) -> list[tuple[Child, int]]:
        """Children that have exited so far, with their exit codes."""
        out = []
        for child in self._children:
            code = child.exit_code()
            if code is not None:
                out.append((child, code))
        return out

    def stop_all(self) -> list[str]:
        """Stop every child (SIGTERM, wait ``stop_timeout_s``, SIGKILL) in waves by kind
        (``stop_rank``); names of the killed. Idempotent."""
        killed: list[ProcRef] = []
        rank_of = self._stop_rank
        for rank in sorted({rank_of(c.spec.kind) for c in self._children}):
            wave = [c.ref for c in self._children if rank_of(c.spec.kind) == rank]
            killed += stop_processes(wave, self.stop_timeout_s)
        for child in self._children:
            try:
                child.popen.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                pass
        return [r.name for r in killed]
