"""Port availability checks (bind probes)."""

from __future__ import annotations

import errno
import socket
from collections.abc import Sequence

from services.common.local.spec import PortClaim


def port_is_free(host: str, port: int) -> bool:
    """True when ``host:port`` can be bound for listening right now.

    SO_REUSEADDR is set so a port whose last connection sits in TIME_WAIT counts as free (as it
    does for the servers we start); a port with a live listener does not. Races are possible:
    this is a check before starting, not a reservation.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
            sock.listen(1)
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return True


def busy_ports(claims: Sequence[PortClaim]) -> list[PortClaim]:
    """The claims whose port cannot be bound now, in order; a port several claims share
    (gateway replicas) is probed and reported once."""
    out: list[PortClaim] = []
    probed: set[tuple[str, int]] = set()
    for c in claims:
        if (c.host, c.port) in probed:
            continue
        probed.add((c.host, c.port))
        if not port_is_free(c.host, c.port):
            out.append(c)
    return out


def tcp_accepts(host: str, port: int, timeout_s: float = 0.5) -> bool:
    """True when something accepts a TCP connection on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False
