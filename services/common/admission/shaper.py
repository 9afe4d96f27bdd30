"""Per-instance dispatch order (pure): what a FCFS engine gets next, decided at the gateway.

Engines (SGLang, vLLM, the simulator) admit waiting prompts first come, first served, and
a prompt whose prefill has started keeps the chunk budget until it ends. On agent traffic the
prompts routed to one instance differ by two orders of magnitude: a session's next turn
re-reads its cached context and prefills a few hundred to a few thousand new tokens (tens to
hundreds of ms), a new session's first turn prefills 60-80k tokens (seconds). Sent as they
come, every turn queued behind a first turn waits out its whole prefill.

Hold: after a pick, a request goes to its instance at once only while that instance's
predicted prefill backlog (the predicted prefill of what this gateway, and with shared state
the other replicas, dispatched there without a first byte yet, counted down as time passes
and corrected by what the engine shows: :mod:`.backlog`) is below ``hold_above_ms``;
otherwise it waits here, bound to that instance.

A prompt whose (scaled) predicted prefill is under an eighth of the threshold always goes at
once: it delays the others by little, and ordering it is not worth its cost. Whenever the
backlog falls below the threshold (a first byte, a release, or time), the first waiting
request in the configured order goes next. Class rank (a higher
SLO class first) comes before everything else in both orders.

``order: shortest``: key = predicted prefill ms - ``age_weight`` * ms waited, lowest first.
Shorter prefills overtake longer ones, and a long prompt gains ``age_weight`` ms of priority
per ms it waits, so it cannot starve.

``order: slo`` (the default): deadlines first. A request with a TTFT deadline that its
predicted prefill can still meet waits in order of the latest time it can start
(deadline - predicted prefill), ahead of every request that cannot meet one any more. A
request that cannot meet its deadline, or has none (a class without a TTFT target), waits in
the ``shortest`` order behind them. A request moves from the first group to the second when
its latest start passes.

Followers (``follow_max_ms`` > 0, 0 here and ``DISPATCH_FOLLOW_MS`` in the shipped
gateway; :mod:`.follow`): a request that would find part of its prefix cached only once
another request this gateway sent (or holds) for the same instance, or with shared state
another replica sent there (:meth:`DispatchShaper.foreign_carrier`), has finished its
prefill, its carrier, waits here until the carrier's first byte and is then offered as if
it had just come (so it hits the prefix instead of computing it again behind the carrier in
the engine), unless the carrier's predicted first byte is more than ``follow_max_ms`` away.
It waits at most ``follow_max_ms``, and goes at once if the carrier fails or is withdrawn.
A follower still waiting carries nothing: a request behind it waits for the same carrier,
set free with it. Waiting costs it little on the instance: FCFS, the engine would have run
the carrier's prefill ahead of it anyway. Whether a turn should wait for its carrier at all
or go elsewhere is the router's choice: its predicted TTFT counts the carrier's prefill in
the instance's queue and the prefix as cached, which is what waiting gives.

Protection (``protect``, off here and in the shipped gateway; :mod:`.protect`): while a
request this gateway sent to an instance can still meet its TTFT deadline and has no first
byte yet, other prompts for that instance wait (all but the smallest; with
``protect_slack`` only those longer than the guards' predicted slack), each at most the
bound it was offered with (its class's ``starve_after_ms``; 0: never held for others).
With ``protect_when_missed`` (the shipped gateway's ``dispatch_protect: auto``) protection
holds only while the fleet is overloaded as this gateway sees it: each offer with a
deadline is predicted on time or late (its instance's backlog, its own prefill and the
instance's recent first-chunk lag against the deadline), and protection is on while the
moving share of late predictions is at least ``protect_when_missed``; off, the order runs
as without protection.

Pure: time is passed in; the shell dispatches what :meth:`offer` and :meth:`release`
return and reports first bytes, releases and cancellations.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from services.common.admission.backlog import SPEED_ALPHA, Backlog
from services.common.admission.follow import Follower, Followers
from services.common.admission.protect import Guards
from services.common.admission.shaper_config import SMALL_SHARE, ShaperConfig

__all__ = ["DispatchShaper"]


@dataclass(slots=True)
class _Instance(Backlog):
    held: list[tuple[int, float, int, str]] = field(default_factory=list)  # shortest first
    timely: list[tuple[int, float, int, str]] = field(default_factory=list)  # latest start
    wake: float | None = None  # protection holds the late ones until then (s), else None
    # observed time to first byte beyond the own predicted prefill, averaged (ms)
    lag_ms: float = 0.0

    def waiting(self) -> int:
        return len(self.held) + len(self.timely)


class DispatchShaper:
    def __init__(self, config: ShaperConfig | None = None) -> None:
        self.config = config or ShaperConfig()
        self._inst: dict[str, _Instance] = {}
        self._where: dict[str, str] = {}  # held rid -> instance
        self._costs: dict[str, tuple[float, float]] = {}  # held rid -> (prefill ms, offered)
        self._seq = 0
        self._follow = Followers()
        self._guards = Guards()
        # rid -> (deadline, end of its protection bound) from its offer to its dispatch
        self._due: dict[str, tuple[float | None, float]] = {}
        # share of the recent offers predicted to miss their deadline (protect_when_missed)
        self._missed = 0.0

    @property
    def enabled(self) -> bool:
        return self.config.hold_above_ms > 0

    def held(self, instance_id: str | None = None) -> int:
        """Requests waiting here (for one instance, or in all)."""
        if instance_id is not None:
            inst = self._inst.get(instance_id)
            return (inst.waiting() if inst else 0) + self._follow.count(instance_id)
        return len(self._where) + self._follow.count()

    @property
    def overloaded(self) -> bool:
        """Whether protection is on now: always, or (``protect_when_missed``) while the
        recent offers were predicted to miss their deadline often enough."""
        return self._missed >= self.config.protect_when_missed

    def missed_share(self) -> float:
        """The share of the recent offers predicted to miss their deadline (moving)."""
        return self._missed

    def backlog_ms(self, instance_id: str, now: float) -> float:
        """Predicted prefill still ahead of a new request dispatched to the instance now:
        this gateway's, plus the other replicas' (:meth:`set_foreign`)."""
        inst = self._inst.get(instance_id)
        return inst.ms(now) if inst is not None else 0.0

    def own_backlog(self, now: float) -> dict[str, float]:
        """This gateway's own backlog per instance (ms, none: absent), for the other
        replicas; nothing while the order is off (it holds nothing back)."""
        if not self.enabled:
            return {}
        return {iid: v.own_ms(now) for iid, v in self._inst.items() if v.busy_until > now}

    def set_foreign(self, backlogs: dict[str, float], now: float) -> dict[str, list[str]]:
        """The other replicas' backlog per instance now (ms; an instance absent has none).
        Returns, per instance with a foreign backlog before or now, the waiting requests to
        dispatch now (none unless it fell; the shell also re-times that instance)."""
        out: dict[str, list[str]] = {}
        # sorted: the same order in every process (a set of strings is not)
        for iid in sorted(
            backlogs.keys() | {i for i, v in self._inst.items() if v.foreign_until > now}
        ):
            fell = self._inst.setdefault(iid, _Instance()).set_foreign(backlogs.get(iid, 0.0), now)
            out[iid] = self.release(iid, now) if fell else []
        return out

    def foreign_carrier(
        self,
        key: str,
        instance_id: str,
        prefix: tuple[int, ...],
        cached_blocks: int,
        prefill_ms: float,
        now: float,
        age_s: float = 0.0,
    ) -> dict[str, list[str]]:
        """Another replica's pick ``key``, made ``age_s`` ago, computes ``prefix`` on
        ``instance_id`` (predicted prefill ``prefill_ms``, ``cached_blocks`` of it predicted
        cached): a carrier for the requests here (:mod:`.follow`) until :meth:`foreign_end`
        or the follow bound from its pick. Returns, per instance, the requests to dispatch
        now (followers of foreign carriers whose time is up). Nothing while followers are
        off."""
        bound = self.config.follow_max_ms / 1000.0
        if not (self.enabled and bound > 0 and prefix) or age_s >= bound:
            return {}
        inst = self._inst.setdefault(instance_id, _Instance())
        own = prefill_ms * inst.speed / 1000.0
        due = now - age_s + inst.ms(now) / 1000.0 + own
        found = self._follow.carrier(instance_id, prefix)
        behind = found[0] if found and self._ahead_ms(inst, found[0], now) <= bound * 1e3 else None
        freed = self._follow.add_foreign(
            key, instance_id, prefix, cached_blocks, own, due, now - age_s + bound, now, behind
        )
        return self._free_all(freed, now)

    def foreign_end(self, key: str, now: float) -> dict[str, list[str]]:
        """Another replica's carrier ``key`` answered or failed: its followers here are set
        free as a local carrier's are at its first byte (per instance, those to dispatch)."""
        return self._free_all(self._follow.end_carrier(key, now), now)

    def _free_all(self, followers: list[Follower], now: float) -> dict[str, list[str]]:
        by: dict[str, list[Follower]] = {}
        for f in followers:
            by.setdefault(f.instance_id, []).append(f)
        return {
            iid: self._free(self._inst[iid], fs, now) + self.release(iid, now)
            for iid, fs in sorted(by.items())
        }

    def offer(
        self,
        rid: str,
        instance_id: str,
        prefill_ms: float,
        now: float,
        rank: int = 0,
        deadline: float | None = None,
        prefix: tuple[int, ...] = (),
        cached_blocks: int = 0,
        protect_ms: float = 0.0,
    ) -> bool:
        """True: dispatch ``rid`` now (counted in the instance's backlog). False: it waits
        here until :meth:`release` or :meth:`first_byte` returns it (or :meth:`cancel`).
        ``deadline``: when its first token is due (s, same clock; ``order: slo`` only).
        ``prefix``: its block hashes and ``cached_blocks`` how many of them its pick
        predicted cached on the instance (both for followers only). ``protect_ms``: how
        long protection may hold it when it cannot meet its deadline (``protect`` only)."""
        inst = self._inst.setdefault(instance_id, _Instance())
        if self.config.protect:
            self._due[rid] = (deadline, now + protect_ms / 1000.0 if protect_ms > 0 else now)
            if deadline is not None:
                ahead = self.backlog_ms(instance_id, now) + prefill_ms + inst.lag_ms
                missed = now + ahead / 1000.0 > deadline
                self._missed += self.config.protect_miss_alpha * (missed - self._missed)
        bound = self.config.follow_max_ms
        if bound > 0 and self.enabled and prefix:
            found = self._follow.carrier(instance_id, prefix)
            self._follow.add_carrier(rid, instance_id, prefix, cached_blocks)
            if found is not None and self._ahead_ms(inst, found[0], now) <= bound:
                self._follow.wait(
                    Follower(
                        rid, found[0], instance_id, now + bound / 1000.0, prefill_ms, now,
                        rank, deadline,
                    )
                )  # fmt: skip
                return False
        return self._offer(inst, rid, instance_id, prefill_ms, now, rank, deadline)

    def _ahead_ms(self, inst: _Instance, carrier: str, now: float) -> float:
        """Predicted time to ``carrier``'s first byte: the rest of its prediction once
        dispatched, else the instance's backlog plus its own (scaled) prefill; another
        replica's: as predicted when it was announced."""
        due = self._follow.foreign_due(carrier)
        if due is not None:
            return max(0.0, (due - now) * 1000.0)
        entry = inst.outstanding.get(carrier)
        if entry is not None:
            return max(0.0, (entry[2] - now) * 1000.0)
        own = self._costs.get(carrier, (0.0, now))[0]
        return inst.own_ms(now) + own * inst.speed

    def _offer(
        self,
        inst: _Instance,
        rid: str,
        instance_id: str,
        prefill_ms: float,
        now: float,
        rank: int,
        deadline: float | None,
    ) -> bool:
        """The order's own rule (followers aside): :meth:`offer`'s answer."""
        hold = self.config.hold_above_ms
        latest = None if deadline is None else deadline - self._need_ms(inst, prefill_ms) / 1000.0
        timely = latest is not None and latest >= now
        kept = self._kept(instance_id, rid, prefill_ms, now)
        if (
            hold <= 0
            or prefill_ms * inst.speed < hold * SMALL_SHARE
            or (
                not kept
                and not (inst.timely or (inst.held and inst.wake is None))
                and self.backlog_ms(instance_id, now) < hold
            )
        ):
            self._dispatch(inst, rid, instance_id, prefill_ms, now)
            return True
        self._where[rid] = instance_id
        self._costs[rid] = (prefill_ms, now)
        if self.config.order == "slo" and timely and latest is not None:
            heapq.heappush(inst.timely, (rank, latest, self._seq, rid))
        else:
            self._push_late(inst, rank, rid)
        if self.config.protect:
            self._guards.hold(instance_id, rid, self._due.get(rid, (None, now))[1])
            # kept: nothing goes before protection ends; else the order may run again
            inst.wake = self._wake(instance_id, now) if kept else None
        self._seq += 1
        return False

    def _need_ms(self, inst: _Instance, prefill_ms: float) -> float:
        """Predicted time from dispatch to the first byte: the own prefill, plus (with
        protection on) what first bytes on the instance took beyond theirs lately."""
        return prefill_ms + inst.lag_ms if self.config.protect and self.overloaded else prefill_ms

    def _kept(self, instance_id: str, rid: str, prefill_ms: float, now: float) -> bool:
        """Whether protection keeps ``rid`` waiting now: its prefill exceeds the budget of
        the instance's guards, and its bound has not run out (:mod:`.protect`)."""
        if not self.config.protect:
            return False
        until = self._due.get(rid, (None, now))[1]
        if until <= now or not self.overloaded:
            return False
        budget = self._guards.budget_ms(instance_id, now)
        if budget is None:
            return False
        return prefill_ms > budget if self.config.protect_slack else True

    def _wake(self, instance_id: str, now: float) -> float | None:
        """When protection may let a held late request go: a guard's deadline or a bound."""
        times = [
            t
            for t in (
                self._guards.guard_until(instance_id, now),
                self._guards.next_due(instance_id),
            )
            if t is not None
        ]
        return min(times) if times else None

    def _push_late(self, inst: _Instance, rank: int, rid: str) -> None:
        prefill_ms, offered = self._costs[rid]
        key = prefill_ms + self.config.age_weight * offered * 1000.0
        heapq.heappush(inst.held, (rank, key, self._seq, rid))
        self._seq += 1

    def first_byte(self, rid: str, instance_id: str, now: float) -> list[str]:
        """``rid``'s prefill ended on ``instance_id``; returns the requests to dispatch."""
        return self._end(rid, instance_id, now, observed=True)

    def done(self, rid: str, instance_id: str, now: float) -> list[str]:
        """``rid`` ended (or failed); after its first byte a no-op but for releasing, else
        it leaves the backlog as :meth:`first_byte` would (its time is not a speed
        sample). Idempotent."""
        return self._end(rid, instance_id, now, observed=False)

    def speed(self, instance_id: str) -> float:
        inst = self._inst.get(instance_id)
        return inst.speed if inst else 1.0

    def _end(self, rid: str, instance_id: str, now: float, observed: bool) -> list[str]:
        inst = self._inst.get(instance_id)
        if inst is None:
            return []
        self._settle(inst, rid, now, observed)
        out = self._free(inst, self._follow.end_carrier(rid, now), now)
        return out + self.release(instance_id, now)

    def _free(self, inst: _Instance, followers: list[Follower], now: float) -> list[str]:
        """Offer followers set free as if they came now: those to dispatch at once."""
        return [
            f.rid
            for f in followers
            if self._offer(inst, f.rid, f.instance_id, f.prefill_ms, now, f.rank, f.deadline)
        ]

    def _settle(self, inst: _Instance, rid: str, now: float, observed: bool) -> None:
        self._guards.end(rid)
        entry = inst.settle(rid, now, observed)
        if entry is not None and observed and self.config.protect:
            scaled, at, _, speed = entry
            lag = max(0.0, (now - at) * 1000.0 - scaled / speed)
            inst.lag_ms += SPEED_ALPHA * (lag - inst.lag_ms)

    def cancel(self, rid: str) -> bool:
        """Withdraw a waiting request (client gone, deadline). False if it is not waiting.
        Its followers, if any, are then let go by the next :meth:`release`."""
        self._due.pop(rid, None)
        self._guards.free(rid)
        if self._follow.cancel(rid):
            self._orphans(rid)
            return True
        iid = self._where.pop(rid, None)
        if iid is None:
            return False
        self._orphans(rid)
        self._costs.pop(rid, None)
        inst = self._inst[iid]
        inst.held = [h for h in inst.held if h[3] != rid]
        heapq.heapify(inst.held)
        inst.timely = [h for h in inst.timely if h[3] != rid]
        heapq.heapify(inst.timely)
        return True

    def _orphans(self, rid: str) -> None:
        """A withdrawn carrier: its followers wait no longer (due now)."""
        for f in self._follow.end_carrier(rid):
            self._follow.wait(
                Follower(
                    f.rid, f.carrier, f.instance_id, float("-inf"), f.prefill_ms, f.offered,
                    f.rank, f.deadline,
                )
            )  # fmt: skip

    def release(self, instance_id: str, now: float) -> list[str]:
        """Waiting requests of ``instance_id`` to dispatch now, in order (each counted in
        the backlog as it goes): followers whose wait is over, then the order's own."""
        inst = self._inst.get(instance_id)
        if inst is None:
            return []
        out = self._free(inst, self._follow.expired(instance_id, now), now)
        if not (inst.held or inst.timely):
            return out
        hold = self.config.hold_above_ms
        inst.wake = None
        while inst.waiting() and self.backlog_ms(instance_id, now) < hold:
            # Deadlines that can no longer be met join the rest.
            while inst.timely and inst.timely[0][1] < now:
                rank, _, _, late = heapq.heappop(inst.timely)
                self._push_late(inst, rank, late)
            rid = self._next(inst, instance_id, now)
            if rid is None:
                inst.wake = self._wake(instance_id, now)
                break
            del self._where[rid]
            self._dispatch(inst, rid, instance_id, self._costs.pop(rid)[0], now)
            out.append(rid)
        return out

    def _next(self, inst: _Instance, instance_id: str, now: float) -> str | None:
        """The next waiting request to go (taken off its heap), or None while protection
        holds every one that may go next."""
        timely, held = inst.timely, inst.held
        heap = timely if timely and (not held or timely[0][0] <= held[0][0]) else held
        rid = heap[0][3]
        if not self._kept(instance_id, rid, self._costs[rid][0], now):
            return heapq.heappop(heap)[3]
        over = self._guards.overdue(instance_id, now)
        if over is None:
            return None
        inst.timely = [h for h in timely if h[3] != over]
        inst.held = [h for h in held if h[3] != over]
        heapq.heapify(inst.timely)
        heapq.heapify(inst.held)
        return over

    def next_release_at(self, instance_id: str) -> float | None:
        """When the backlog of an instance with waiting requests falls below the threshold
        by prediction alone (the shell's timer), or None."""
        inst = self._inst.get(instance_id)
        if inst is None:
            return None
        expiry = self._follow.next_expiry(instance_id)
        if not inst.waiting():
            return expiry
        at = inst.falls_to(self.config.hold_above_ms)
        if inst.wake is not None:
            at = max(at, inst.wake)  # the late ones wait for protection to end
        return at if expiry is None else min(at, expiry)

    def _dispatch(
        self, inst: _Instance, rid: str, instance_id: str, prefill_ms: float, now: float
    ) -> None:
        if self.config.protect:
            self._guards.free(rid)
            deadline = self._due.pop(rid, (None, now))[0]
            self._guards.delay(instance_id, prefill_ms)
            need = self._need_ms(inst, prefill_ms) / 1000.0
            if deadline is not None and deadline - need >= now:
                self._guards.add(instance_id, rid, deadline, now + need)
        inst.add(rid, prefill_ms, now)
