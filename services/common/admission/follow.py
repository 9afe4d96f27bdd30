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

Other gateway replicas' picks are carriers too (:meth:`Followers.add_foreign`): a session's
turns reach the replicas at random, so its next turn often comes to another replica than
the one holding its carrier. Each such pick is announced with its prefix and predicted
prefill, and its first byte announced again; a foreign carrier whose end never arrives is
dropped at the deadline it was added with. A foreign pick that would itself follow a
carrier known here is taken to wait for it on its own replica, as a follower here would: it
is no carrier until that one ends (*parked* behind it), else a session's turns spread over
two replicas would again queue one after another.
"""

from __future__ import annotations

import heapq
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


@dataclass(frozen=True, slots=True)
class _Parked:
    instance_id: str
    prefix: tuple[int, ...]
    cached_blocks: int
    prefill_s: float


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
        # other replicas' carriers: key -> predicted first byte (s), and (dropped at, key)
        self._foreign_due: dict[str, float] = {}
        self._foreign_until: list[tuple[float, str]] = []
        # foreign picks parked behind a carrier: carrier -> [key], key -> its announcement
        self._parked: dict[str, list[str]] = {}
        self._parked_as: dict[str, _Parked] = {}

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

    def add_foreign(
        self,
        key: str,
        instance_id: str,
        prefix: tuple[int, ...],
        cached_blocks: int,
        prefill_s: float,
        due: float,
        until: float,
        now: float,
        behind: str | None = None,
    ) -> list[Follower]:
        """Another replica's pick ``key`` computes ``prefix`` on ``instance_id`` (its own
        prefill ``prefill_s``), its first byte predicted at ``due``: a carrier until
        :meth:`end_carrier` or ``until``; with ``behind`` (the carrier it would follow
        here), parked until that one ends, then a carrier due ``prefill_s`` later.
        Returns the followers of the foreign carriers whose time is up now (set free)."""
        if prefix and key not in self._carrier_at and key not in self._parked_as:
            if behind is not None and behind in self._carrier_at:
                self._parked.setdefault(behind, []).append(key)
                self._parked_as[key] = _Parked(instance_id, prefix, cached_blocks, prefill_s)
            else:
                self.add_carrier(key, instance_id, prefix, cached_blocks)
                self._foreign_due[key] = due
            heapq.heappush(self._foreign_until, (until, key))
        out: list[Follower] = []
        heap = self._foreign_until
        while heap and heap[0][0] <= now:
            old = heapq.heappop(heap)[1]
            self._parked_as.pop(old, None)
            if old in self._foreign_due:
                out.extend(self.end_carrier(old, now))
        return out

    def foreign_due(self, key: str) -> float | None:
        """A foreign carrier's predicted first byte (s), None for a local one."""
        return self._foreign_due.get(key)

    def wait(self, f: Follower) -> None:
        self._inst.setdefault(f.instance_id, _Instance()).waiting[f.rid] = f
        self._follower_at[f.rid] = f.instance_id

    def is_waiting(self, rid: str) -> bool:
        return rid in self._follower_at

    def end_carrier(self, rid: str, now: float | None = None) -> list[Follower]:
        """``rid`` answered, ended or was withdrawn: it carries nothing any more; its
        followers are set free (returned, in the order they came), and the foreign picks
        parked behind it are carriers from ``now`` (unknown: due at once)."""
        iid = self._carrier_at.pop(rid, None)
        self._foreign_due.pop(rid, None)
        self._parked_as.pop(rid, None)
        for key in self._parked.pop(rid, ()):
            p = self._parked_as.pop(key, None)
            if p is not None:
                self.add_carrier(key, p.instance_id, p.prefix, p.cached_blocks)
                self._foreign_due[key] = 0.0 if now is None else now + p.prefill_s
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
