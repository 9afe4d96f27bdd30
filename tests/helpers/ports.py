"""Free TCP ports on 127.0.0.1 for tests that must name a port before something binds it
(a config file, a subprocess flag). Prefer binding port 0 where the code allows it.

Every port handed out lies outside the kernel's ephemeral range: a port chosen now and
bound a moment later by a child process can then not be taken in between by an outgoing
connection (of this test run or anything else on the machine), which draws its local port
from that range."""

from __future__ import annotations

import random
import socket
from pathlib import Path

__all__ = ["free_port", "free_ports", "port_range"]

_EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")
_RNG = random.SystemRandom()


def free_port() -> int:
    """A port that was free a moment ago (another process may take it before it is used)."""
    return free_ports(1)[0]


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports that were free a moment ago."""
    out: list[int] = []
    while len(out) < n:
        port, _ = port_range(1)
        if port not in out:
            out.append(port)
    return out


def port_range(n: int) -> tuple[int, int]:
    """``(first, last)`` of ``n`` consecutive ports, all free a moment ago and outside the
    ephemeral range (ports handed to engines later, a driver's ``port_min..port_max``)."""
    spans = _spans(n)
    for _ in range(500):
        first, last = spans[_RNG.randrange(len(spans))]
        start = _RNG.randint(first, last)
        if all(_bindable(p) for p in range(start, start + n)):
            return start, start + n - 1
    raise RuntimeError(f"no {n} consecutive free ports outside the ephemeral range")


def _spans(n: int) -> list[tuple[int, int]]:
    """Where a run of ``n`` ports may start: below and above the ephemeral range."""
    low, high = 32768, 60999
    if _EPHEMERAL.exists():
        low, high = (int(x) for x in _EPHEMERAL.read_text().split())
    spans = [(s, e - n + 1) for s, e in ((10000, low - 1), (high + 1, 65535)) if e - n + 1 >= s]
    if not spans:
        raise RuntimeError(f"no {n} ports outside the ephemeral range {low}-{high}")
    return spans


def _bindable(port: int) -> bool:
    """Nothing listens on the port, no connection uses it, and none lingers in TIME_WAIT."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
