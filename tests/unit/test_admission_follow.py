"""Followers wait for their carrier's first byte (services.common.admission.follow, and
the dispatch order that uses it, services.common.admission.shaper)."""

from __future__ import annotations

import asyncio

import pytest

from services.common.admission.follow import Follower, Followers, shared_blocks
from services.common.admission.shaper import DispatchShaper
from services.common.admission.shaper_config import ShaperConfig
from services.scheduler.admission.dispatch import DispatchOrder

# A session's prompts as block-hash chains: turn 2 extends turn 1, another session does not.
TURN1 = (1, 2, 3, 4, 5, 6, 7, 8)
TURN2 = (*TURN1, 9, 10)
OTHER = (50, 51, 52, 53)


def _shaper(follow_ms: float = 10_000.0, hold_ms: float = 150.0) -> DispatchShaper:
    return DispatchShaper(ShaperConfig(hold_above_ms=hold_ms, follow_max_ms=follow_ms))


@pytest.mark.parametrize(
    ("a", "b", "n"),
    [(TURN1, TURN2, 8), (TURN2, TURN1, 8), (TURN1, OTHER, 0), ((), TURN1, 0), ((1, 9), TURN1, 1)],
    ids=["prefix", "symmetric", "disjoint", "empty", "diverge-after-one"],
)
def test_shared_blocks(a: tuple[int, ...], b: tuple[int, ...], n: int) -> None:
    assert shared_blocks(a, b) == n


@pytest.mark.parametrize(
    ("carriers", "prefix", "expect"),
    [
        # (rid, chain, cached blocks): the one that computes the most blocks of the prefix
        ([("c1", TURN1, 0)], TURN2, ("c1", 8)),
        # the carrier found its first 8 blocks cached: it computes none of TURN1's
        ([("c1", TURN2, 8)], TURN1, None),
        ([("c1", TURN2, 6)], TURN1, ("c1", 2)),
        ([("short", TURN1[:3], 0), ("long", TURN1, 2)], TURN2, ("long", 6)),
        # the latest turn reaches furthest: its prefill ends after the earlier one's
        ([("t1", TURN1, 0), ("t2", TURN2, 8)], (*TURN2, 11), ("t2", 2)),
        ([("c1", OTHER, 0)], TURN2, None),
        ([], TURN2, None),
    ],
    ids=[
        "whole-prefix",
        "carrier-hit-itself",
        "carrier-computes-part",
        "most-blocks-wins",
        "furthest-wins",
        "other-session",
        "no-carrier",
    ],
)
def test_carrier_choice(
    carriers: list[tuple[str, tuple[int, ...], int]],
    prefix: tuple[int, ...],
    expect: tuple[str, int] | None,
) -> None:
    f = Followers()
    for rid, chain, cached in carriers:
        f.add_carrier(rid, "a", chain, cached)
    assert f.carrier("a", prefix) == expect
    assert f.carrier("b", prefix) is None  # carriers are per instance


@pytest.mark.parametrize(
    ("follow_ms", "carrier_ms", "prefix", "target", "held"),
    [
        # the follower's own prefill is tiny (predicted as a hit): without the rule it goes
        (10_000.0, 5_000.0, TURN2, "a", True),
        (0.0, 5_000.0, TURN2, "a", False),  # off
        (10_000.0, 5_000.0, OTHER, "a", False),  # nothing of its prefix is being computed
        (10_000.0, 5_000.0, TURN2, "b", False),  # the carrier is on another instance
        (2_000.0, 5_000.0, TURN2, "a", False),  # carrier's first byte beyond the bound
    ],
    ids=["held", "off", "unrelated", "other-instance", "carrier-too-far"],
)
def test_follower_held_only_behind_its_carrier(
    follow_ms: float, carrier_ms: float, prefix: tuple[int, ...], target: str, held: bool
) -> None:
    s = _shaper(follow_ms)
    assert s.offer("carrier", "a", carrier_ms, 0.0, prefix=TURN1)
    assert s.offer("f", target, 5.0, 1.0, prefix=prefix, cached_blocks=8) is not held
    assert s.held(target) == int(held)


@pytest.mark.parametrize(
    ("event", "at", "expect"),
    [
        ("first_byte", 4.0, ["f"]),  # the carrier answered: its prefix is cached now
        ("done", 4.0, ["f"]),  # the carrier failed: no reason to wait any more
        ("release", 4.0, []),  # the bound has not run out
        ("release", 11.0, ["f"]),  # the bound ran out (offered at 1 s, 10 s bound)
    ],
    ids=["carrier-answers", "carrier-fails", "still-waiting", "bound-runs-out"],
)
def test_follower_released(event: str, at: float, expect: list[str]) -> None:
    s = _shaper(10_000.0)
    assert s.offer("carrier", "a", 5_000.0, 0.0, prefix=TURN1)
    assert not s.offer("f", "a", 5.0, 1.0, prefix=TURN2, cached_blocks=8)
    assert s.next_release_at("a") == pytest.approx(11.0)
    if event == "first_byte":
        got = s.first_byte("carrier", "a", at)
    elif event == "done":
        got = s.done("carrier", "a", at)
    else:
        got = s.release("a", at)
    assert got == expect
    assert s.held("a") == 1 - len(expect)


def test_a_freed_follower_takes_its_place_in_the_order() -> None:
    """Set free, a follower is offered as if it came then: with another request waiting for
    the instance, it joins the order (here ahead of a longer prompt) instead of jumping it."""
    s = _shaper(10_000.0)
    assert s.offer("carrier", "a", 1_000.0, 0.0, prefix=TURN1)
    assert not s.offer("big", "a", 3_000.0, 0.0, prefix=OTHER)  # waits in the order
    assert not s.offer("f", "a", 800.0, 0.1, prefix=TURN2, cached_blocks=8)
    assert s.first_byte("carrier", "a", 0.5) == ["f"]  # 800 ms before 3,000 ms
    assert s.held("a") == 1
    assert s.release("a", 1.0) == []  # f's 800 ms are ahead of big
    assert s.first_byte("f", "a", 1.3) == ["big"]


def test_withdrawn_carrier_lets_its_followers_go() -> None:
    s = _shaper(20_000.0, hold_ms=150.0)
    assert s.offer("long", "a", 8_000.0, 0.0)  # keeps the instance busy
    assert not s.offer("carrier", "a", 4_000.0, 0.0, prefix=TURN1)  # held in the order
    assert not s.offer("f", "a", 5.0, 0.1, prefix=TURN2, cached_blocks=8)  # behind it
    assert s.held("a") == 2
    assert s.cancel("carrier")
    assert s.next_release_at("a") == float("-inf")
    assert s.release("a", 0.2) == ["f"]
    assert s.held() == 0


def test_cancelled_follower_is_gone() -> None:
    s = _shaper()
    assert s.offer("carrier", "a", 5_000.0, 0.0, prefix=TURN1)
    assert not s.offer("f", "a", 5.0, 1.0, prefix=TURN2, cached_blocks=8)
    assert s.cancel("f") and not s.cancel("f")
    assert s.first_byte("carrier", "a", 2.0) == []
    assert s.held() == 0


TURN3 = (*TURN2, 11, 12)


@pytest.mark.parametrize(
    ("waiting", "freed_at", "expect"),
    [
        # t2 waits for t1: it computes blocks 9 and 10 only after t1's first byte, when
        # blocks 1-8 are cached, so turn 3 waits for t1 too (and goes with t2)
        (True, None, ("t1", 8)),
        (False, None, ("t2", 2)),  # t2 was sent: its prefill ends after t1's
        (True, 2.0, ("t2", 2)),  # t2's wait ran out: it is sent, a carrier again
        (True, 0.5, ("t1", 8)),  # not yet run out
    ],
    ids=["waiting-follower-skipped", "sent-follower-carries", "expired-carries", "still-waiting"],
)
def test_a_waiting_follower_is_no_carrier(
    waiting: bool, freed_at: float | None, expect: tuple[str, int] | None
) -> None:
    f = Followers()
    f.add_carrier("t1", "a", TURN1, 0)
    f.add_carrier("t2", "a", TURN2, 8)
    if waiting:
        f.wait(Follower("t2", "t1", "a", 1.0, 5.0, 0.0, 0, None))
    if freed_at is not None:
        f.expired("a", freed_at)
    assert f.carrier("a", TURN3) == expect


@pytest.mark.parametrize(
    ("t3_at", "at_t1_answer", "at_t2_answer"),
    [
        # t2 still waits for t1: t3 waits for t1 as well, and both go at its first byte
        (1.5, ["t2", "t3"], []),
        # t2 was sent at t1's first byte (4.0): t3 waits for t2's blocks 9 and 10
        (4.05, ["t2"], ["t3"]),
    ],
    ids=["behind-a-waiting-follower", "behind-a-sent-follower"],
)
def test_a_session_s_turns_do_not_wait_one_after_another(
    t3_at: float, at_t1_answer: list[str], at_t2_answer: list[str]
) -> None:
    """A turn behind a follower that still waits goes with it, instead of one first byte
    (a prefill and the first streamed chunk) after it: a chain of waits would hold each
    later turn of a busy session one more first byte."""
    s = _shaper()
    assert s.offer("t1", "a", 5_000.0, 0.0, prefix=TURN1)
    assert not s.offer("t2", "a", 5.0, 1.0, prefix=TURN2, cached_blocks=8)
    if t3_at < 4.0:
        assert not s.offer("t3", "a", 5.0, t3_at, prefix=TURN3, cached_blocks=10)
    assert s.first_byte("t1", "a", 4.0) == at_t1_answer
    if t3_at > 4.0:
        assert not s.offer("t3", "a", 5.0, t3_at, prefix=TURN3, cached_blocks=10)
    assert s.first_byte("t2", "a", 4.1) == at_t2_answer
    assert s.held() == 0


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


async def test_order_shell_holds_a_follower_until_its_carrier_answers() -> None:
    clock = _Clock()
    order = DispatchOrder(_shaper(), clock)
    assert order.offer("carrier", "a", 5_000.0, prefix=TURN1) is None
    turn = order.offer("f", "a", 5.0, prefix=TURN2, cached_blocks=8)
    assert turn is not None
    waiting = asyncio.create_task(order.wait("f", turn))
    await asyncio.sleep(0)
    assert not waiting.done()
    clock.t = 3.0
    order.first_byte("carrier")
    await asyncio.wait_for(waiting, 1.0)
    order.done("f")
    order.done("carrier")
    assert order.shaper.held() == 0
    order.close()


# -- another replica's carriers -----------------------------------------------------------
@pytest.mark.parametrize(
    ("follow_ms", "age_s", "carrier_ms", "target", "held"),
    [
        (10_000.0, 0.0, 5_000.0, "a", True),
        (0.0, 0.0, 5_000.0, "a", False),  # followers off: no carrier taken
        (10_000.0, 10.0, 5_000.0, "a", False),  # announced a bound ago: too old to wait for
        (10_000.0, 0.0, 5_000.0, "b", False),  # the carrier computes on another instance
        (2_000.0, 0.0, 5_000.0, "a", False),  # its first byte is predicted past the bound
        (10_000.0, 4.0, 5_000.0, "a", True),  # old, but its prediction is still within
    ],
    ids=["held", "off", "too-old", "other-instance", "carrier-too-far", "aged"],
)
def test_a_foreign_carrier_holds_its_followers(
    follow_ms: float, age_s: float, carrier_ms: float, target: str, held: bool
) -> None:
    s = _shaper(follow_ms)
    assert s.foreign_carrier("B/t1", "a", TURN1, 0, carrier_ms, 1.0, age_s=age_s) == {}
    assert s.offer("f", target, 5.0, 1.0, prefix=TURN2, cached_blocks=8) is not held
    assert s.held(target) == int(held)


@pytest.mark.parametrize(
    ("event", "at", "expect"),
    [
        ("answered", 2.0, {"a": ["f"]}),  # the other replica announced its first byte
        ("other-carrier", 2.0, {}),  # another foreign carrier's end frees nothing here
        ("announce", 5.0, {}),  # a later announcement before the carrier's bound
        ("announce", 11.2, {"a": ["f"]}),  # after it (announced at 1 s, 10 s bound)
    ],
    ids=["carrier-answers", "other-ends", "within-bound", "carrier-expired"],
)
def test_a_foreign_carrier_s_followers_go(
    event: str, at: float, expect: dict[str, list[str]]
) -> None:
    s = _shaper(10_000.0)
    assert s.foreign_carrier("B/t1", "a", TURN1, 0, 3_000.0, 1.0) == {}
    assert not s.offer("f", "a", 5.0, 1.5, prefix=TURN2, cached_blocks=8)
    if event == "answered":
        got = s.foreign_end("B/t1", at)
    elif event == "other-carrier":
        got = s.foreign_end("B/other", at)
    else:
        got = s.foreign_carrier("B/t9", "b", OTHER, 0, 100.0, at)
    assert got == expect
    assert s.held("a") == 1 - sum(len(v) for v in expect.values())


TURN3 = (*TURN2, 11, 12)


@pytest.mark.parametrize(
    ("steps", "held"),
    [
        # X (turn 2, another replica) would follow C (turn 1): parked, no carrier; turn 3
        # waits for C, as it would for a local follower's carrier
        (["C", "X", "offer-f"], {"f": "B/c"}),
        # C answered: X computes now and is the carrier turn 3 waits for
        (["C", "X", "end-C", "offer-f"], {"f": "B/x"}),
        # X answered before C's end arrived: it carries nothing when C ends
        (["C", "X", "end-X", "end-C", "offer-f"], {}),
        # C's carrier time ran out: X is promoted as C is dropped
        (["C", "X", "expire-C", "offer-f"], {"f": "B/x"}),
        # without C, X is a carrier at once
        (["X", "offer-f"], {"f": "B/x"}),
    ],
    ids=["parked", "promoted", "answered-while-parked", "carrier-expired", "no-carrier"],
)
def test_a_foreign_pick_behind_a_carrier_is_parked(steps: list[str], held: dict[str, str]) -> None:
    s = _shaper(10_000.0)
    for step in steps:
        if step == "C":
            assert s.foreign_carrier("B/c", "a", TURN1, 0, 2_000.0, 0.0) == {}
        elif step == "X":
            assert s.foreign_carrier("B/x", "a", TURN2, 8, 100.0, 0.1) == {}
        elif step == "end-C":
            s.foreign_end("B/c", 2.0)
        elif step == "end-X":
            s.foreign_end("B/x", 1.5)
        elif step == "expire-C":  # any later announcement prunes expired carriers
            s.foreign_carrier("B/o", "b", OTHER, 0, 10.0, 10.05)
        else:
            s.offer("f", "a", 5.0, 10.06 if "expire-C" in steps else 3.0, prefix=TURN3,
                    cached_blocks=10)  # fmt: skip
    assert s.held("a") == len(held)
    if held:
        assert s.foreign_end("B/c" if held["f"] == "B/x" else "B/x", 11.0) == {}  # not it
        assert s.foreign_end(held["f"], 11.0) == {"a": ["f"]}
