"""A session's rendezvous home (pure): the instance every gateway replica ranks first for a
session, computed alike everywhere without shared state.

The scheduler's ``session-home`` scorer routes by it, and session migration
(:mod:`.migration`) moves a scaled-in instance's sessions to it, so the KV goes where the
router will send the session's next turn. A sub-agent's key is its parent session's id (its
prompt starts from the parent's): :func:`route_key`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

__all__ = ["rendezvous_home", "route_key"]


def route_key(session_id: str, parent_session_id: str = "") -> str:
    """The key a session is placed by: its parent's id when it has one, else its own."""
    return parent_session_id or session_id


def rendezvous_home(key: str, instance_ids: Sequence[str]) -> str | None:
    """The highest-random-weight (rendezvous) choice of ``key`` among ``instance_ids``:
    the id with the largest keyed hash of ``(key, id)``. Independent of order and of the
    process, so every replica computes the same home; losing an instance moves only the
    keys whose home it was. None for no ids."""
    best: tuple[bytes, str] | None = None
    k = key.encode() + b"\0"
    for iid in instance_ids:
        h = hashlib.blake2b(k + iid.encode(), digest_size=8).digest()
        if best is None or (h, iid) > best:
            best = (h, iid)
    return best[1] if best else None
