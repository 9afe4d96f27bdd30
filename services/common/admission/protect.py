"""Protection of requests that can still meet their TTFT (pure; part of the dispatch order,
:mod:`.shaper`).

A streamed request's first token reaches the client with the engine's first chunk: its
prefill, then a chunk's worth of decode steps. A long prompt sent to the same engine in the
meantime shares those steps (chunked prefill) and stretches each of them; at overload a new
agent session's 60-80k-token first turn can push every other request on its engine past a
2 s TTFT. A request whose own predicted prefill already exceeds what is left of its TTFT
budget (or that has no deadline) gains nothing from going at once.

So, with protection on, an instance is *guarded* while a request this gateway dispatched
there can still meet its deadline and has no first byte yet (a guard; a dispatch is timely
when its deadline is no nearer than its own predicted prefill plus what first bytes on the
instance took beyond their own prefill lately). While an instance is guarded, every prompt
for it but the smallest (the shaper's small share, which go at once anyway) waits in the
gateway, in the order's usual sequence, unless it has waited its bound, the class's
``starve_after_ms``, or its class has none (0: never held for others). With a slack budget
(``protect_slack``) only a prompt longer than the budget waits: each guard has a predicted
first byte and so a slack to its deadline, the smallest slack is the budget, and a prompt
that fits goes and moves every guard's predicted first byte by its prefill (the engine
interleaves their chunks). Once no guard is left (first bytes, or the guards' deadlines
passed) the order runs as without protection. Nothing is shed.

Under ``dispatch_protect: auto`` the dispatch order consults the guards only while most of
the recent requests were predicted to miss their TTFT when offered (:mod:`.shaper`): below
saturation holding serializes requests that would all have met their TTFT by going at once.

This module keeps the guards per instance and the held requests' release times.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

__all__ = ["Guards"]


@dataclass(slots=True)
class _Instance:
    guards: list[tuple[float, str]] = field(default_factory=list)  # (deadline, rid), lazy
    # held late requests: (time their bound runs out, seq, rid), earliest first, lazy
    due: list[tuple[float, int, str]] = field(default_factory=list)


class Guards:
    def __init__(self) -> None:
        self._inst: dict[str, _Instance] = {}
        # guarding rid -> [its deadline, its predicted first byte] (s)
        self._live: dict[str, list[float]] = {}
        self._held: dict[str, float] = {}  # held rid -> when its bound runs out (s)
        self._seq = 0

    # -- guards: dispatched, timely, no first byte yet ----------------------------------
    def add(self, instance_id: str, rid: str, deadline: float, first_byte: float) -> None:
        inst = self._inst.setdefault(instance_id, _Instance())
        self._live[rid] = [deadline, first_byte]
        heapq.heappush(inst.guards, (deadline, rid))

    def end(self, rid: str) -> None:
        """``rid``'s first byte came, or it ended (idempotent)."""
        self._live.pop(rid, None)

    def guarded(self, instance_id: str, now: float) -> bool:
        """Whether a guard of the instance is still live at ``now``."""
        return self.guard_until(instance_id, now) is not None

    def guard_until(self, instance_id: str, now: float) -> float | None:
        """The earliest deadline of the instance's live guards (None: not guarded)."""
        inst = self._inst.get(instance_id)
        if inst is None:
            return None
        g, live = inst.guards, self._live
        while g and (g[0][0] < now or g[0][1] not in live):
            live.pop(heapq.heappop(g)[1], None)
        return g[0][0] if g else None

    def budget_ms(self, instance_id: str, now: float) -> float | None:
        """The smallest slack (deadline - predicted first byte) of the instance's live
        guards, ms; None when it has none."""
        if self.guard_until(instance_id, now) is None:
            return None
        live = self._live
        return min(
            (live[r][0] - live[r][1]) * 1000.0
            for _, r in self._inst[instance_id].guards
            if r in live
        )

    def delay(self, instance_id: str, ms: float) -> None:
        """Work of ``ms`` went to the instance: its live guards' first bytes move by it.
        The instance's heap drops its ended guards here too: nothing else may look at it
        for a long time (``auto`` protection consults the guards only under overload)."""
        inst = self._inst.get(instance_id)
        if inst is None or ms <= 0:
            return
        live = self._live
        alive = [g for g in inst.guards if g[1] in live]
        if len(alive) < len(inst.guards):
            heapq.heapify(alive)
            inst.guards = alive
        for _, r in alive:
            live[r][1] += ms / 1000.0

    # -- held late requests and their bounds ---------------------------------------------
    def hold(self, instance_id: str, rid: str, until: float) -> None:
        """``rid`` (late) waits for ``instance_id``; protection holds it until ``until``."""
        inst = self._inst.setdefault(instance_id, _Instance())
        self._held[rid] = until
        heapq.heappush(inst.due, (until, self._seq, rid))
        self._seq += 1

    def free(self, rid: str) -> None:
        """``rid`` no longer waits (dispatched or withdrawn; idempotent)."""
        self._held.pop(rid, None)

    def may_go(self, rid: str, now: float) -> bool:
        """Whether protection lets the held ``rid`` go now even when guarded."""
        until = self._held.get(rid)
        return until is None or until <= now

    def overdue(self, instance_id: str, now: float) -> str | None:
        """The held request of the instance whose bound ran out first, if one has."""
        head = self._first_due(instance_id)
        return head[2] if head is not None and head[0] <= now else None

    def next_due(self, instance_id: str) -> float | None:
        """When the next held request's bound runs out (the shell's timer), or None."""
        head = self._first_due(instance_id)
        return head[0] if head is not None else None

    def _first_due(self, instance_id: str) -> tuple[float, int, str] | None:
        """The instance's held request whose bound runs out first (stale entries dropped)."""
        inst = self._inst.get(instance_id)
        if inst is None:
            return None
        d, held = inst.due, self._held
        while d and held.get(d[0][2]) != d[0][0]:
            heapq.heappop(d)
        return d[0] if d else None
