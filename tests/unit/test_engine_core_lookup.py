"""The engine core's tier lookup at admission: a turn whose prefix was resident when it was
submitted but evicted while it waited asks the tier again when it is admitted (as vLLM's KV
connectors are asked at scheduling), and is admitted with what the shell fetched."""

from __future__ import annotations

import pytest

from services.common.engine_core.core import CoreConfig, EngineCore, Lookup, Request, SeqOutput
from services.common.engine_core.core_types import lookup_due
from services.common.engine_core.kvcache import KVCache
from services.common.perfmodel import get_profile
from services.common.tokens import block_hashes

PROFILE = get_profile("test")
BS = 16
PREFIX = tuple(range(1000, 1096))  # 6 full blocks
TURN = PREFIX + tuple(range(5000, 5032))  # the prefix and 2 more blocks


@pytest.mark.parametrize(
    ("at_submit", "now", "fetched", "due"),
    [
        (6, 6, 0, False),
        (6, 2, 0, True),
        (6, 0, 0, True),
        (0, 0, 0, False),
        (6, 2, 96, False),  # the fetch at submission covered them
        (6, 2, 64, True),
    ],
    ids=[
        "still-resident",
        "partly-evicted",
        "all-evicted",
        "nothing-resident-at-submission",
        "fetched-at-submission",
        "fetched-less-than-resident",
    ],
)
def test_lookup_due(at_submit: int, now: int, fetched: int, due: bool) -> None:
    assert lookup_due(at_submit, now, fetched, BS) is due


def make(blocks: int = 12) -> EngineCore:
    return EngineCore(CoreConfig(max_batch=8, max_batched_tokens=256), PROFILE, KVCache(blocks, BS))


def drive(core: EngineCore, now: float, answer: tuple[int, float] | None) -> list[SeqOutput]:
    """Step until idle; each lookup drained is answered with ``answer`` (None: asserts that
    no lookup is asked for). Returns the outputs."""
    outs: list[SeqOutput] = []
    for _ in range(10_000):
        for lk in core.drain_lookups():
            assert answer is not None, f"unexpected lookup {lk}"
            assert core.looked_up(lk.rid, *answer)
        wake = core.next_wakeup(now)
        if wake is None:
            return outs
        now = max(now, wake)
        res = core.step(now)
        if res is not None:
            outs.extend(res.outputs)
            now += res.duration_ms
    raise AssertionError("core did not go idle")


def evicted_while_waiting(core: EngineCore, lookup: bool) -> None:
    """The prefix is cached; a long prompt is admitted first and evicts it while the turn
    waits behind it."""
    drive(core, 0.0, None)
    core.submit(Request("prefix", PREFIX, 4), 0.0)
    drive(core, 0.0, None)
    assert core.cache.match(_hashes(TURN)) == 6
    core.submit(Request("long", tuple(range(9000, 9150)), 4), 1000.0)
    core.submit(Request("turn", TURN, 4, tier_lookup=lookup), 1000.0)


def _hashes(prompt: tuple[int, ...]) -> list[int]:
    return block_hashes(prompt, BS)


def final(outs: list[SeqOutput], rid: str) -> SeqOutput:
    return [o for o in outs if o.rid == rid and o.finished][-1]


@pytest.mark.parametrize(
    ("answer", "cached"),
    [((96, 0.0), 96), ((96, 25.0), 96), ((0, 0.0), None)],
    ids=["fetched", "fetched-with-modelled-wait", "tier-holds-none"],
)
def test_a_prefix_evicted_while_waiting_is_looked_up_at_admission(
    answer: tuple[int, float], cached: int | None
) -> None:
    core = make()
    evicted_while_waiting(core, lookup=True)
    asked: list[Lookup] = []
    for _ in range(1000):  # until the turn's admission asks the tier
        res = core.step(1000.0)
        asked += core.drain_lookups()
        if asked or res is None:
            break
    assert [lk.rid for lk in asked] == ["turn"]
    assert asked[0].resident < 6 and asked[0].hashes == tuple(_hashes(TURN))
    assert core.knows("turn") and core.num_waiting == 1
    assert core.looked_up("turn", *answer)
    out = final(drive(core, 2000.0, None), "turn")
    assert out.completion_tokens == 4
    if cached is not None:
        assert out.cached_tokens == cached
    else:  # computed what is not resident
        assert out.cached_tokens == asked[0].resident * BS


@pytest.mark.parametrize("lookup", [False, True], ids=["no-tier", "tier"])
def test_no_lookup_when_the_prefix_stays_resident_or_without_a_tier(lookup: bool) -> None:
    core = make(blocks=64)
    evicted_while_waiting(core, lookup)  # room for both: nothing is evicted
    out = final(drive(core, 1000.0, None), "turn")
    assert out.cached_tokens == 96


def test_without_tier_lookup_an_evicted_prefix_is_recomputed() -> None:
    core = make()
    evicted_while_waiting(core, lookup=False)
    out = final(drive(core, 1000.0, None), "turn")
    assert out.cached_tokens < 96


def test_a_turn_aborted_during_its_lookup_is_forgotten() -> None:
    core = make()
    evicted_while_waiting(core, lookup=True)
    asked: list[Lookup] = []
    while not asked and core.step(1000.0) is not None:
        asked = core.drain_lookups()
    asked = asked or core.drain_lookups()
    assert [lk.rid for lk in asked] == ["turn"]
    core.abort("turn")
    assert not core.knows("turn") and core.num_waiting == 0
    assert core.looked_up("turn", 96, 0.0) is False
