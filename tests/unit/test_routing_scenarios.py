"""The shipped profiles on small scenarios: cache affinity, hot-spot spill, P/D decisions."""

from __future__ import annotations

import random

import pytest

from services.common.routing.config import load_default
from services.common.routing.types import EndpointSnapshot, EndpointView, Pick, PrefixMatch
from services.common.tokens import block_hashes
from tests.unit._routing_helpers import ENV, ep, req

PROMPT = list(range(5000, 5000 + 4096))
HASHES = tuple(block_hashes(PROMPT, 4))


def fleet(n: int = 4, **load: int) -> list[EndpointView]:
    return [ep(f"w{i}", **load) for i in range(n)]


@pytest.mark.parametrize("answered", [True, False], ids=["answered", "still-prefilling"])
@pytest.mark.parametrize("profile", ["default", "cache_aware", "agent", "prefix-ready"])
def test_second_turn_follows_the_first(profile: str, answered: bool) -> None:
    """The second turn goes where the first went. `prefix-ready` predicts it to hit the
    first's prefix only once the first answered (before, its prefill has not committed it);
    the others count it from the pick."""
    s = load_default(env=ENV, rng=random.Random(0))
    snap = EndpointSnapshot(fleet())
    t1 = req("t1", prompt_tokens=len(PROMPT), block_hashes=HASHES, session_id="s")
    first = s.schedule(t1, snap, 0.0, profile)
    assert isinstance(first, Pick)
    if answered:
        s.settle(t1, first, True)
    longer = HASHES + tuple(block_hashes(PROMPT + list(range(64)), 4)[len(HASHES) :])
    second = s.schedule(
        req("t2", prompt_tokens=len(PROMPT) + 64, block_hashes=longer, session_id="s"),
        snap,
        1.0,
        profile,
    )
    assert isinstance(second, Pick)
    assert second.decode.endpoint.instance_id == first.decode.endpoint.instance_id
    if profile != "cache_aware":
        ready = answered or profile != "prefix-ready"
        assert second.predicted_cached_tokens == (len(PROMPT) if ready else 0)


def test_default_spills_off_a_hot_cached_instance() -> None:
    s = load_default(env=ENV)
    snap = EndpointSnapshot([ep("w0", waiting=40), ep("w1", waiting=1), ep("w2", waiting=2)])
    matches = {"w0": PrefixMatch(len(HASHES))}
    d = s.schedule(
        req(prompt_tokens=len(PROMPT), block_hashes=HASHES, prefix_matches=matches), snap, 0.0
    )
    assert isinstance(d, Pick) and d.decode.endpoint.instance_id == "w1"


def test_default_prefers_indexed_prefix_when_load_is_comparable() -> None:
    s = load_default(env=ENV)
    snap = EndpointSnapshot([ep("w0", waiting=3), ep("w1", waiting=1), ep("w2", waiting=2)])
    matches = {"w0": PrefixMatch(len(HASHES), {"gpu": len(HASHES)})}
    d = s.schedule(
        req(prompt_tokens=len(PROMPT), block_hashes=HASHES, prefix_matches=matches), snap, 0.0
    )
    assert isinstance(d, Pick) and d.decode.endpoint.instance_id == "w0"
    assert d.predicted_cached_tokens == len(PROMPT)


def test_default_avoids_long_prefill_queue() -> None:
    s = load_default(env=ENV)
    snap = EndpointSnapshot([ep("w0", pending_prefill_tokens=200_000), ep("w1")])
    d = s.schedule(req(prompt_tokens=2000), snap, 0.0)
    assert isinstance(d, Pick) and d.decode.endpoint.instance_id == "w1"


PD = [
    ep("p0", role="prefill"),
    ep("p1", role="prefill", pending_prefill_tokens=50_000),
    ep("d0", role="decode"),
]


# (prompt, cached on d0, cached on p0, requests waiting on d0) -> the prefill pick. The
# default decider (decode engines can prefill) keeps a long suffix on d0 unless the P/D
# path is predicted faster (p0 holds the prompt) or d0 is backlogged.
@pytest.mark.parametrize(
    ("prompt", "cached_on_decode", "cached_on_prefill", "waiting", "prefill"),
    [
        (4096, 0, 4000, 0, "p0"),
        (4096, 0, 0, 0, None),
        (4096, 0, 0, 1, "p0"),
        (300, 0, 0, 0, None),
        (4096, 4000, 0, 0, None),
    ],
    ids=[
        "long-held-by-prefill-disaggregated",
        "long-cold-equal-stays-local",
        "long-decode-backlogged-disaggregated",
        "short-decode-only",
        "cached-on-decode",
    ],
)
def test_default_pd(
    prompt: int, cached_on_decode: int, cached_on_prefill: int, waiting: int, prefill: str | None
) -> None:
    s = load_default(env=ENV)
    hashes = HASHES[: prompt // 4]
    matches = {}
    if cached_on_decode:
        matches["d0"] = PrefixMatch(cached_on_decode // 4)
    if cached_on_prefill:
        matches["p0"] = PrefixMatch(cached_on_prefill // 4)
    snap = EndpointSnapshot([*PD[:2], ep("d0", role="decode", waiting=waiting)])
    d = s.schedule(
        req(prompt_tokens=prompt, block_hashes=hashes, prefix_matches=matches or None), snap, 0.0
    )
    assert isinstance(d, Pick) and d.decode.endpoint.instance_id == "d0"
    assert (d.prefill.endpoint.instance_id if d.prefill else None) == prefill


def test_same_inputs_same_decisions() -> None:
    def run() -> list[str]:
        s = load_default(env=ENV, rng=random.Random(5))
        snap = EndpointSnapshot(fleet(6))
        out = []
        for i in range(50):
            hs = tuple(block_hashes(list(range(i % 7, i % 7 + 64)), 4))
            for prof in ("default", "power_of_two", "round_robin"):
                d = s.schedule(
                    req(f"r{i}", prompt_tokens=64, block_hashes=hs), snap, float(i), prof
                )
                assert isinstance(d, Pick)
                out.append(d.decode.endpoint.instance_id)
        return out

    assert run() == run()


@pytest.mark.parametrize(
    ("profile", "prompt", "winner"),
    [
        # w0 runs 8 decodes with no queue; w1 runs none behind 5,000 queued prefill tokens
        # (500 ms). A 20,000-token prompt (2 s of prefill): its TTFT is best on w0, where
        # it would stall 8 decodes for 2 s; `tpot-guard` prices that (0.25 * 8 * 2000 ms).
        ("ttft-placement", 20_000, "w0"),
        ("tpot-guard", 20_000, "w1"),
        # A 2,000-token prompt (200 ms) stalls them by little: it keeps the better TTFT.
        ("ttft-placement", 2_000, "w0"),
        ("tpot-guard", 2_000, "w0"),
        # `default` (decode-tpot) scores the stall itself (8 decodes x 2 s / 256 tokens
        # each) for a prompt whose own prefill is at least 500 ms, and leaves shorter ones
        ("default", 20_000, "w1"),
        ("default", 2_000, "w0"),
        ("decode-tpot", 20_000, "w1"),
        # `decode-tpot-spread` scores the TPOT spared, 8 x 2000 / 256 = 62.5 ms: enough
        ("decode-tpot-spread", 20_000, "w1"),
    ],
    ids=[
        "ttft-placement-long",
        "tpot-guard-long",
        "ttft-placement-short",
        "tpot-guard-short",
        "default-long",
        "default-short",
        "decode-tpot-is-default",
        "decode-tpot-spread-long",
    ],
)
def test_tpot_guard_keeps_long_prefills_off_running_decodes(
    profile: str, prompt: int, winner: str
) -> None:
    s = load_default(env=ENV)
    snap = EndpointSnapshot([ep("w0", running=8), ep("w1", pending_prefill_tokens=5000)])
    d = s.schedule(req(prompt_tokens=prompt), snap, 0.0, profile)
    assert isinstance(d, Pick) and d.decode.endpoint.instance_id == winner


@pytest.mark.parametrize(
    ("profile", "running", "winner"),
    [
        # A 20,000-token prompt (2 s of prefill); w1 runs nothing behind 500 ms of queued
        # prefill, w0 runs `running` decodes. The ratio form gives w1 the whole lead over
        # one or two decodes (none against some); the spread form gives it 2 x 2000 / 256
        # = 15.6 ms of 1000, less than the TTFT, and moves the prompt at 8 decodes (62.5 ms).
        ("ttft-placement", 2, "w0"),
        ("default", 2, "w1"),
        ("decode-tpot-spread", 2, "w0"),
        ("decode-tpot-spread", 8, "w1"),
    ],
    ids=["ttft-placement-2", "ratio-2", "spread-2", "spread-8"],
)
def test_decode_tpot_spread_moves_only_large_stalls(
    profile: str, running: int, winner: str
) -> None:
    s = load_default(env=ENV)
    snap = EndpointSnapshot([ep("w0", running=running), ep("w1", pending_prefill_tokens=5000)])
    d = s.schedule(req(prompt_tokens=20_000), snap, 0.0, profile)
    assert isinstance(d, Pick) and d.decode.endpoint.instance_id == winner
