"""``tideserve up``'s stop signals (checked between start-up steps) and its state-dir lock."""

from __future__ import annotations

import contextlib
import fcntl
import signal
import threading
import types
from collections.abc import Iterator
from pathlib import Path

__all__ = ["Signals", "StartFailed", "StopRequested", "state_lock"]


class StartFailed(Exception):
    """Start-up cannot go on; the message is one line for the user."""


class StopRequested(Exception):
    """A stop signal arrived during start-up (the message names it)."""


class Signals:
    """SIGINT, SIGTERM and SIGHUP (terminal closed) set ``event`` and nothing else: start-up
    checks it between steps (:meth:`checkpoint`), so a signal never interrupts a step half way
    (e.g. a server started but its handle not yet returned, which could then not be stopped)."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.name = ""
        self._previous: dict[signal.Signals, object] = {}

    def _handler(self, signum: int, frame: types.FrameType | None) -> None:
        self.name = signal.Signals(signum).name
        self.event.set()

    def checkpoint(self) -> None:
        """Raise StopRequested once a stop signal has arrived."""
        if self.event.is_set():
            raise StopRequested(self.name)

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            self._previous[sig] = signal.signal(sig, self._handler)
        try:
            yield
        finally:
            for sig, prev in self._previous.items():
                signal.signal(sig, prev)  # type: ignore[arg-type]


@contextlib.contextmanager
def state_lock(state_dir: Path) -> Iterator[None]:
    """Exclusive lock on ``<state_dir>/up.lock`` for the lifetime of ``up``."""
    state_dir.mkdir(parents=True, exist_ok=True)
    with (state_dir / "up.lock").open("a") as fh:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise StartFailed(
                f"another `tideserve up` is running with state dir {state_dir}"
            ) from None
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
