"""Followers and their carriers (pure; part of the dispatch order, :mod:`.shaper`).

An engine caches a prompt's KV when its prefill ends. An agent session's next turn often
arrives while its previous turn (the *carrier*: the request whose prompt is the new turn's
prefix) is still prefilling on the instance the router sent both to. Sent at once, the new
turn (the *follower*) queues behind the carrier in the engine and, admitted before the
carrier's blocks are committed, computes the shared prefix again. Held at the gateway until
the carrier's first byte and sent then, it waits the same prefill and hits the prefix.

This module keeps, per instance, the prompts this gateway sent or holds there without a
first byte yet (the carriers), finds a new request's carrier (the one whose prompt shares
the longest run of blocks with it, provided it computes some of them: beyond what that
carrier itself was predicted to find cached), and keeps the followers waiting for their
carriers, each with a deadline after which it goes anyway. The shaper decides when to hold
and what to do with a follower set free.

A follower still waiting is no carrier until it is set free. Its prefill starts only after
its own carrier's first byte, and then the blocks both share are cached: a new turn that
waited for it would go one first byte (a prefill plus the first streamed chunk) later
still, and each later turn of the session one more, so that a busy session's turns queue
in the gateway one after another. The new turn waits for the same carrier instead, is set
free with the waiting one, and computes again only the blocks the waiting one adds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Follower", "Followers", "shared_blocks"]


def shared_blocks(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    """Length of the common leading run of two block-hash chains."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


@dataclass(frozen=True, slots=True)
class Follower:
    rid: str
    carrier: str
    instance_id: str
    until: float  # goes anyway at this time (s)
    prefill_ms: float
    offered: float
    rank: int
    deadline: float | None


@dataclass(slots=True)
class _Instance:
    # carrier rid -> (its block hashes, blocks its pick predicted cached)
    carriers: dict[str, tuple[tuple[int, ...], int]] = field(default_factory=dict)
    waiting: dict[str, Follower] = field(default_factory=dict)


class Followers:
    def __init__(self) -> None:
        self._inst: dict[str, _Instance] = {}
        self._carrier_at: dict[str, str] = {}  # carrier rid -> instance
        self._follower_at: dict[str, str] = {}  # waiting follower rid -> instance

    def count(self, instance_id: str | None = None) -> int:
        """Followers waiting (for one instance, or in all)."""
        if instance_id is None:
            return len(self._follower_at)
        inst = self._inst.get(instance_id)
        return len(inst.waiting) if inst else 0

    def carrier(self, instance_id: str, prefix: tuple[int, ...]) -> tuple[str, int] | None:
        """The carrier on ``instance_id`` to wait for, and how many blocks of ``prefix`` it
        computes (those it shares beyond its own cached part); None when no carrier
        computes any. Of those that do, the one that reaches furthest into ``prefix``: a
        session's turns each extend the last, and the latest one's prefill ends last (FCFS),
        when the blocks of those before it are cached too. A follower still waiting is
        skipped (module doc): the new request waits for what that one waits for."""
        inst = self._inst.get(instance_id)
        if inst is None or not prefix:
            return None
        best: tuple[str, int] | None = None
        reach = 0
        waiting = inst.waiting
        for rid, (chain, cached) in inst.carriers.items():
            if not chain or chain[0] != prefix[0] or rid in waiting:
                continue
            shared = shared_blocks(chain, prefix)
            gain = shared - cached
            if gain > 0 and (shared > reach or (shared == reach and best and gain > best[1])):
                best, reach = (rid, gain), shared
        return best

    def add_carrier(
        self, rid: str, instance_id: str, prefix: tuple[int, ...], cached_blocks: int
    ) -> None:
        """``rid`` goes (or waits to go) to ``instance_id``: a carrier until it ends."""
        if prefix:
            self._inst.setdefault(instance_id, _Instance()).carriers[rid] = (
                prefix,
                cached_blocks,
            )
            self._carrier_at[rid] = instance_id

    def wait(self, f: Follower) -> None:
        self._inst.setdefault(f.instance_id, _Instance()).waiting[f.rid] = f
        self._follower_at[f.rid] = f.instance_id

    def is_waiting(self, rid: str) -> bool:
        return rid in self._follower_at

    def end_carrier(self, rid: str) -> list[Follower]:
        """``rid`` answered, ended or was withdrawn: it carries nothing any more; its
        followers are set free (returned, in the order they came)."""
        iid = self._carrier_at.pop(rid, None)
        if iid is None:
            return []
        inst = self._inst[iid]
        inst.carriers.pop(rid, None)
        freed = [f for f in inst.waiting.values() if f.carrier == rid]
        for f in freed:
            self._drop(inst, f.rid)
        return freed

    def cancel(self, rid: str) -> bool:
        """Withdraw a waiting follower. False if it is not waiting."""
        iid = self._follower_at.get(rid)
        if iid is None:
            return False
        self._drop(self._inst[iid], rid)
        return True

    def expired(self, instance_id: str, now: float) -> list[Follower]:
        """Followers of ``instance_id`` whose wait is over (set free, returned)."""
        inst = self._inst.get(instance_id)
        if inst is None or not inst.waiting:
            return []
        out = [f for f in inst.waiting.values() if f.until <= now]
        for f in out:
            self._drop(inst, f.rid)
        return out

    def next_expiry(self, instance_id: str) -> float | None:
        inst = self._inst.get(instance_id)
        if inst is None or not inst.waiting:
            return None
        return min(f.until for f in inst.waiting.values())

    def _drop(self, inst: _Instance, rid: str) -> None:
        del inst.waiting[rid]
        del self._follower_at[rid]
