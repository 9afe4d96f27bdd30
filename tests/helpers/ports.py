"""Free TCP ports on 127.0.0.1 for tests that must name a port before something binds it
(a config file, a subprocess flag). Prefer binding port 0 where the code allows it."""

from __future__ import annotations

import random
import socket
from pathlib import Path

__all__ = ["free_port", "free_ports", "port_range"]

_EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")


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


def port_range(n: int) -> tuple[int, int]:
    """``(first, last)`` of ``n`` consecutive ports, all free a moment ago and outside the
    kernel's ephemeral range, so that no outgoing connection of any process on the machine
    can take one of them before the code under test binds it (ports handed to engines
    later, a driver's ``port_min..port_max``)."""
    low, high = 32768, 60999
    if _EPHEMERAL.exists():
        low, high = (int(x) for x in _EPHEMERAL.read_text().split())
    spans = [(s, e - n) for s, e in ((10000, low - 1), (high + 1, 65535)) if e - n >= s]
    if not spans:
        raise RuntimeError(f"no {n} ports outside the ephemeral range {low}-{high}")
    rng = random.Random()
    for _ in range(200):
        first, last = spans[rng.randrange(len(spans))]
        start = rng.randint(first, last)
        if all(_bindable(p) for p in range(start, start + n)):
            return start, start + n - 1
    raise RuntimeError(f"no {n} consecutive free ports outside {low}-{high}")


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
