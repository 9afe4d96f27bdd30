"""Free TCP ports on 127.0.0.1 for tests that must name a port before something binds it
(a config file, a subprocess flag). Prefer binding port 0 where the code allows it."""

from __future__ import annotations

import socket

__all__ = ["free_port", "free_ports"]


def free_port() -> int:
    """A port that was free a moment ago (another process may take it before it is used)."""
    return free_ports(1)[0]


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports that were free a moment ago (all held open while choosing, so
    they differ)."""
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()
