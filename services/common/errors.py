"""Startup errors: one clear line on stderr and exit code 2, never a traceback wall.

Anything that stops a service from starting (bad settings, unreachable Postgres or Redis, a
port already in use) is raised as a :class:`StartupError` (or a subclass) whose message is a
single line naming the setting at fault. ``main`` functions turn it into
``tideserve-<service>: <message>`` on stderr and :data:`EXIT_STARTUP` via :func:`report`.
"""

from __future__ import annotations

import sys
from typing import TextIO

EXIT_STARTUP = 2
"""Process exit code for a service that could not start (bad settings, dependency down)."""


def one_line(text: str, limit: int = 400) -> str:
    """Collapse ``text`` to a single line (whitespace runs become one space), cut at ``limit``."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


class StartupError(Exception):
    """A service cannot start. ``str(err)`` is one line naming the setting at fault."""

    def __init__(self, message: str) -> None:
        super().__init__(one_line(message))


class SettingsError(StartupError):
    """Malformed settings (file, environment or command line); names the bad setting."""


class PortInUseError(StartupError):
    """A listening port is taken. Carries the setting name and port for callers (the stack)."""

    def __init__(self, service: str, setting: str, host: str, port: int) -> None:
        self.service = service
        self.setting = setting
        self.host = host
        self.port = port
        super().__init__(f"{setting} {host}:{port} is already in use (service {service})")


def report(service: str, err: BaseException, stream: TextIO | None = None) -> int:
    """Print ``tideserve-<service>: <one line>`` for ``err`` and return :data:`EXIT_STARTUP`."""
    out = stream if stream is not None else sys.stderr
    message = one_line(str(err)) or type(err).__name__
    print(f"tideserve-{service}: {message}", file=out, flush=True)
    return EXIT_STARTUP
