"""The scheduler-local KV index replica (pure core): events in, per-instance per-tier
matches out, with kvmeta's sequencing contract (duplicates, gaps, epochs, full states)."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import pytest

from services.common.routing.types import PrefixMatch
from services.scheduler.feeds.kv_replica_core import (
    ALL_CLEARED,
    REMOVED,
    STORED,
    TIER_NAMES,
    KVReplica,
    Verdict,
)


@dataclass(frozen=True)
class Ev:
    kind: int
    block_hashes: tuple[int, ...] = ()
    tier: int = 1
    tenant: str = ""
    lora: str = ""


def S(*hs: int, tier: int = 1, tenant: str = "", lora: str = "") -> Ev:
    return Ev(STORED, hs, tier, tenant, lora)


def R(*hs: int, tier: int = 1, tenant: str = "", lora: str = "") -> Ev:
    return Ev(REMOVED, hs, tier, tenant, lora)


CLR = Ev(ALL_CLEARED)
CHAIN = (11, 12, 13, 14, 15)

# (instance, epoch, seq, events[, continues])
Batch = tuple[Any, ...]


def run(batches: list[Batch]) -> tuple[KVReplica, list[Verdict]]:
    r = KVReplica()
    out = [r.apply(b[0], b[1], b[2], b[3], *(b[4:] or (False,))) for b in batches]
    return r, out


def pm(n: int, **tiers: int) -> PrefixMatch:
    return PrefixMatch(matched_blocks=n, tiers=tiers or {"gpu": n})


CASES: list[tuple[list[Batch], dict[str, Any], dict[str, PrefixMatch]]] = [
    ([("a", 1, 1, [S(11, 12, 13)])], {}, {"a": pm(3)}),
    ([("a", 1, 1, [S(*CHAIN)]), ("b", 1, 1, [S(11, 12)])], {}, {"a": pm(5), "b": pm(2)}),
    ([("a", 1, 1, [S(*CHAIN)]), ("a", 1, 2, [R(13)])], {}, {"a": pm(2)}),
    ([("a", 1, 1, [S(*CHAIN)]), ("a", 1, 2, [CLR])], {}, {}),
    ([("a", 1, 1, [S(12, 13)])], {}, {}),  # a chain matches from its first block only
    # duplicates: the same batch again (or an older seq) changes nothing
    (
        [("a", 1, 1, [S(*CHAIN)]), ("a", 1, 2, [R(12)]), ("a", 1, 1, [S(*CHAIN)])],
        {},
        {"a": pm(1)},
    ),
    (
        [("a", 1, 1, [S(*CHAIN)]), ("a", 1, 1, [S(*CHAIN)]), ("a", 1, 2, [S(11)])],
        {},
        {"a": pm(5)},
    ),
    # tiers: a block held in several tiers counts in each; unspecified tier 0 is GPU
    ([("a", 1, 1, [S(11, 12), S(13, tier=2)])], {}, {"a": pm(3, gpu=2, cpu=1)}),
    (
        [("a", 1, 1, [S(11, 12, 13, tier=0), S(11, 12, tier=3)])],
        {},
        {"a": pm(3, gpu=3, ssd=2)},
    ),
    (
        [("a", 1, 1, [S(11, tier=2), S(12, tier=4)]), ("b", 1, 1, [S(11, 12, 13)])],
        {},
        {"a": pm(2, cpu=1, remote=1), "b": pm(3, gpu=3)},
    ),
    # namespaces: tenant (cache salt) and lora are separate spaces
    ([("a", 1, 1, [S(*CHAIN, tenant="t1")])], {}, {}),
    ([("a", 1, 1, [S(*CHAIN, tenant="t1")])], {"tenant": "t1"}, {"a": pm(5)}),
    ([("a", 1, 1, [S(11, 12, lora="l"), S(*CHAIN)])], {"lora": "l"}, {"a": pm(2)}),
    # a gap (or the first batch seen mid-life: trimmed history) makes the instance stale
    ([("a", 1, 1, [S(*CHAIN)]), ("a", 1, 3, [S(16)])], {}, {}),
    ([("a", 1, 7, [S(*CHAIN)]), ("b", 1, 1, [S(11)])], {}, {"b": pm(1)}),
    # ... until a full state arrives (in one batch, or several with `continues`)
    ([("a", 1, 7, [S(*CHAIN)]), ("a", 1, 8, [CLR, S(11, 12)])], {}, {"a": pm(2)}),
    ([("a", 1, 7, [S(*CHAIN)]), ("a", 1, 8, [CLR, S(11)], True)], {}, {}),
    (
        [("a", 1, 7, [S(*CHAIN)]), ("a", 1, 8, [CLR, S(11)], True), ("a", 1, 9, [S(12)])],
        {},
        {"a": pm(2)},
    ),
    ([("a", 1, 8, [CLR, S(11)], True), ("a", 1, 10, [S(12)])], {}, {}),  # gap inside it
    # epochs: a newer one resets the instance; an older one is ignored
    ([("a", 1, 1, [S(*CHAIN)]), ("a", 2, 1, [S(11)])], {}, {"a": pm(1)}),
    ([("a", 2, 1, [S(11)]), ("a", 1, 2, [S(*CHAIN)])], {}, {"a": pm(1)}),
    # unknown instance, unknown blocks: removing them is a no-op
    ([("a", 1, 1, [R(11, 12)]), ("a", 1, 2, [S(11)])], {}, {"a": pm(1)}),
    ([("a", 1, 1, [S(*CHAIN)]), ("b", 1, 1, [R(*CHAIN)])], {}, {"a": pm(5)}),
    # candidates narrow the answer
    (
        [("a", 1, 1, [S(*CHAIN)]), ("b", 1, 1, [S(11)])],
        {"candidates": ["b", "zz"]},
        {"b": pm(1)},
    ),
]
IDS = [
    "stored", "two-instances", "removed-middle", "cleared", "no-first-block",
    "duplicate-replayed", "duplicate-twice", "tiers-gpu-cpu", "tier0-is-gpu-and-ssd",
    "tiers-per-instance", "tenant-other-space", "tenant-match", "lora-space",
    "gap-stale", "first-seen-midlife-stale", "full-state-heals", "full-state-partial-stale",
    "full-state-continued", "gap-inside-full-state", "new-epoch-resets", "old-epoch-ignored",
    "removed-unknown", "removed-other-instance", "candidates",
]  # fmt: skip


@pytest.mark.parametrize(("batches", "query", "want"), CASES, ids=IDS)
def test_match(batches: list[Batch], query: dict[str, Any], want: dict[str, PrefixMatch]) -> None:
    r, _ = run(batches)
    got = r.match(CHAIN, **query)
    assert {k: (v.matched_blocks, dict(v.tiers)) for k, v in got.items()} == {
        k: (v.matched_blocks, dict(v.tiers)) for k, v in want.items()
    }


@pytest.mark.parametrize(
    ("batches", "outcomes", "stale"),
    [
        ([("a", 1, 1, [S(1)]), ("a", 1, 2, [S(2)])], ["applied", "applied"], []),
        ([("a", 1, 1, [S(1)]), ("a", 1, 1, [S(1)])], ["applied", "duplicate"], []),
        ([("a", 2, 1, [S(1)]), ("a", 1, 9, [S(1)])], ["applied", "duplicate"], []),
        ([("a", 1, 1, [S(1)]), ("a", 1, 3, [S(1)])], ["applied", "gap"], ["a"]),
        ([("a", 1, 3, [S(1)]), ("a", 1, 4, [CLR])], ["gap", "applied"], []),
        ([("a", 1, 3, [S(1)]), ("a", 2, 1, [S(1)])], ["gap", "applied"], []),
        ([("a", 1, 3, [S(1)]), ("a", 2, 2, [S(1)])], ["gap", "gap"], ["a"]),
    ],
    ids=["in-order", "dup-seq", "older-epoch", "gap", "full-heals", "epoch-heals", "epoch-gap"],
)
def test_outcomes_and_stale(batches: list[Batch], outcomes: list[str], stale: list[str]) -> None:
    r, out = run(batches)
    assert [o.value for o in out] == outcomes
    assert r.stale_instances() == stale


def test_drop_and_compact_keep_answers_and_reuse_slots() -> None:
    r, _ = run([("a", 1, 1, [S(*CHAIN)]), ("b", 1, 1, [S(11, 12)]), ("c", 1, 1, [S(11, 12, 13)])])
    assert r.drop_instance("b") is True
    assert r.drop_instance("b") is False
    r.apply("a", 2, 1, [S(11)])  # new epoch: a's old slot retired too
    assert r.retired_slots == 2
    before = r.match(CHAIN)
    assert set(before) == {"a", "c"}
    assert r.compact() > 0
    assert r.retired_slots == 0
    assert r.match(CHAIN) == before
    assert r.entry_count() == 1 + 3
    r.apply("d", 1, 1, [S(*CHAIN)])  # reuses a freed slot; no stale bit leaks into it
    assert r.match(CHAIN)["d"].matched_blocks == 5
    assert r.match(CHAIN)["a"].matched_blocks == 1


def test_due_resyncs_back_off_and_stop_once_healed() -> None:
    r = KVReplica(resync_after_s=5.0, max_resync_after_s=8.0)
    r.apply("b", 1, 4, [S(1)])
    r.apply("a", 1, 4, [S(1)])
    assert r.due_resyncs(0.0) == [("a", 1), ("b", 1)]
    assert r.due_resyncs(4.9) == []
    assert r.due_resyncs(5.0) == [("a", 1), ("b", 1)]  # second attempt after 5 s
    assert r.due_resyncs(12.9) == []  # third after min(10, 8) = 8 s
    r.forget_asked(["b"])  # b's request was not published: asked again at once
    assert r.due_resyncs(13.0) == [("a", 1), ("b", 1)]
    r.apply("a", 1, 5, [CLR, S(1)])
    r.apply("b", 2, 1, [S(1)])
    assert r.due_resyncs(100.0) == []
    r.apply("b", 2, 5, [S(1)])  # stale again: asked at once
    assert r.due_resyncs(100.0) == [("b", 2)]


@pytest.mark.parametrize(
    ("calls", "dropped"),
    [
        ([(["a", "b"], 0.0), (["a", "b"], 100.0)], []),
        ([(["a"], 0.0), (["a"], 59.0)], []),  # b absent, not yet for the grace period
        ([(["a"], 0.0), (["a"], 60.0)], ["b"]),
        ([(["a"], 0.0), (["a", "b"], 30.0), (["a"], 70.0)], []),  # came back: clock restarts
        ([(["a"], 0.0), (["a", "b"], 30.0), (["a"], 70.0), (["a"], 130.0)], ["b"]),
        ([([], 0.0), ([], 60.0)], ["a", "b"]),
    ],
    ids=["present", "within-grace", "gone", "came-back", "gone-again", "empty-fleet"],
)
def test_retain_drops_instances_gone_from_the_fleet(
    calls: list[tuple[list[str], float]], dropped: list[str]
) -> None:
    r, _ = run([("a", 1, 1, [S(*CHAIN)]), ("b", 1, 1, [S(*CHAIN)])])
    gone: list[str] = []
    for present, now in calls:
        gone += r.retain(present, now, 60.0)
    assert gone == dropped
    assert sorted(r.match(CHAIN)) == sorted({"a", "b"} - set(dropped))


def test_tier_names_cover_kv_event_tiers() -> None:
    assert set(TIER_NAMES.values()) == {"gpu", "cpu", "ssd", "remote"}


def _naive(state: dict[str, dict[tuple[str, str, int], set[int]]], live: set[str],
           chain: list[int], ns: tuple[str, str]) -> dict[str, tuple[int, dict[str, int]]]:  # fmt: skip
    out = {}
    for iid in live:
        tabs = {t: hs for (te, lo, t), hs in state.get(iid, {}).items() if (te, lo) == ns}
        n = 0
        while n < len(chain) and any(chain[n] in hs for hs in tabs.values()):
            n += 1
        if n:
            tiers: dict[str, int] = {}
            for t, hs in tabs.items():
                c = sum(1 for h in chain[:n] if h in hs)
                if c:
                    tiers[TIER_NAMES[t]] = tiers.get(TIER_NAMES[t], 0) + c
            out[iid] = (n, tiers)
    return out


@pytest.mark.parametrize("seed", [1, 2, 3, 4], ids=lambda s: f"seed{s}")
def test_random_operations_agree_with_a_naive_model(seed: int) -> None:
    """In-order batches (no gaps) of random stores/removes/clears over several instances,
    tiers and namespaces, with drops, epochs and compaction: the replica answers exactly
    what a set-per-(instance, namespace, tier) model says."""
    rng = random.Random(seed)
    r = KVReplica()
    ids = [f"i{k}" for k in range(6)]
    seq = dict.fromkeys(ids, 0)
    epoch = dict.fromkeys(ids, 1)
    state: dict[str, dict[tuple[str, str, int], set[int]]] = {}
    chains = [[rng.randrange(1, 40) for _ in range(12)] for _ in range(4)]
    for step in range(600):
        iid = rng.choice(ids)
        roll = rng.random()
        if roll < 0.03:
            r.drop_instance(iid)
            state.pop(iid, None)
            seq[iid], epoch[iid] = 0, epoch[iid] + 1
            continue
        if roll < 0.06:
            epoch[iid] += 1
            seq[iid] = 0
            state.pop(iid, None)
        events: list[Ev] = []
        for _ in range(rng.randrange(1, 4)):
            ns = rng.choice([("", ""), ("t", ""), ("", "l")])
            tier = rng.choice([1, 1, 2, 3])
            c = rng.choice(chains)
            k = rng.randrange(1, len(c) + 1)
            kind = rng.choices([STORED, REMOVED, ALL_CLEARED], [6, 3, 0.3])[0]
            if kind == ALL_CLEARED:
                events.append(CLR)
                state.pop(iid, None)
                continue
            hs = c[:k] if kind == STORED else c[rng.randrange(0, k) : k]
            events.append(Ev(kind, tuple(hs), tier, *ns))
            tab = state.setdefault(iid, {}).setdefault((*ns, tier), set())
            if kind == STORED:
                tab.update(hs)
            else:
                tab.difference_update(hs)
        seq[iid] += 1
        assert r.apply(iid, epoch[iid], seq[iid], events) is Verdict.APPLIED
        if step % 50 == 0:
            r.compact()
        chain = rng.choice(chains)[: rng.randrange(1, 13)]
        ns = rng.choice([("", ""), ("t", ""), ("", "l")])
        live = {i.instance_id for i in r.instances()}
        got = {k: (v.matched_blocks, dict(v.tiers)) for k, v in r.match(chain, *ns).items()}
        assert got == _naive(state, live, chain, ns), f"step {step}"


@pytest.mark.parametrize(
    ("deployment", "profile", "salt", "hashes", "want"),
    [
        ("dep", "", "", CHAIN, {"a": 5}),
        ("dep", "", "t1", CHAIN, {"b": 2}),
        ("dep", "precise", "", CHAIN[:2], {"a": 2}),
        ("dep", "round_robin", "", CHAIN, None),  # a profile without precise data
        ("other", "", "", CHAIN, None),  # another deployment
        ("dep", "", "", (), None),  # nothing to match
    ],
    ids=["match", "salt-namespace", "named-profile", "profile-skipped", "other-deployment",
         "no-hashes"],
)  # fmt: skip
async def test_local_lookup_hook(
    deployment: str, profile: str, salt: str, hashes: tuple[int, ...], want: dict[str, int] | None
) -> None:
    """The gateway's / servicer's ``prefix_lookup`` hook over the replica."""
    from services.common.routing.types import RequestView
    from services.scheduler.feeds.kv_replica import LocalLookup

    r, _ = run([("a", 1, 1, [S(*CHAIN)]), ("b", 1, 1, [S(11, 12, tenant="t1")])])
    lookup = LocalLookup(r, deployment="dep", profiles=frozenset({"", "precise"}))
    view = RequestView(request_id="x", prompt_tokens=64 * len(hashes), block_hashes=hashes,
                       block_size=64)  # fmt: skip
    got = await lookup(view, deployment, salt, profile)
    assert (None if got is None else {k: v.matched_blocks for k, v in got.items()}) == want
    assert lookup.stats["skipped"] == (1 if want is None else 0)
