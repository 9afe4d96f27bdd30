"""Property-based tests (hypothesis) of pure cores against simple reference models: the KV
index (chain match = longest fully held prefix per instance; a snapshot answers as the index
did), block-hash chains (a prompt's hashes start with its prefix's; tenants never share)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from services.common.admission.queue import (
    AdmissionQueue,
    Admitted,
    ClassSpec,
    QueueConfig,
    QueuedRequest,
)
from services.common.kvindex import ALL_CLEARED, REMOVED, STORED, BlockEvent, ChainIndex
from services.common.tokens.whitespace import block_hashes
from services.kvmeta.index import PrefixIndex

HASHES = st.integers(0, 7)  # few distinct blocks, so chains overlap often
INSTANCES = ("a", "b", "c")
EVENT = st.one_of(
    st.builds(
        BlockEvent,
        kind=st.sampled_from([STORED, REMOVED]),
        block_hashes=st.lists(HASHES, max_size=4).map(tuple),
        tier=st.sampled_from([0, 1, 2, 3, 4]),
    ),
    st.just(BlockEvent(ALL_CLEARED)),
    st.builds(BlockEvent, kind=st.integers(-3, 9)),  # unknown kinds are ignored
)
BATCHES = st.lists(st.tuples(st.sampled_from(INSTANCES), st.lists(EVENT, max_size=4)), max_size=12)


def model(batches: list[tuple[str, list[BlockEvent]]]) -> dict[str, dict[int, set[int]]]:
    """Each instance's blocks and the tiers holding them, applied in order."""
    held: dict[str, dict[int, set[int]]] = {}
    for inst, events in batches:
        blocks = held.setdefault(inst, {})
        for ev in events:
            tier = ev.tier or 1
            if ev.kind == ALL_CLEARED:
                blocks.clear()
            elif ev.kind == STORED:
                for h in ev.block_hashes:
                    blocks.setdefault(h, set()).add(tier)
            elif ev.kind == REMOVED:
                for h in ev.block_hashes:
                    tiers = blocks.get(h, set())
                    tiers.discard(tier)
                    if not tiers:
                        blocks.pop(h, None)
    return held


def expected_lengths(held: dict[str, dict[int, set[int]]], chain: list[int]) -> dict[str, int]:
    out: dict[str, int] = {}
    for inst, blocks in held.items():
        k = 0
        while k < len(chain) and chain[k] in blocks:
            k += 1
        if k:
            out[inst] = k
    return out


def apply_all(index: ChainIndex, batches: list[tuple[str, list[BlockEvent]]]) -> None:
    seqs: dict[str, int] = {}
    for inst, events in batches:
        seqs[inst] = seqs.get(inst, 0) + 1
        index.apply(inst, 1, seqs[inst], events)


@given(BATCHES, st.lists(HASHES, max_size=6))
def test_chain_match_is_the_longest_fully_held_prefix(
    batches: list[tuple[str, list[BlockEvent]]], chain: list[int]
) -> None:
    index = ChainIndex()
    apply_all(index, batches)
    assert index.lookup(chain).lengths() == expected_lengths(model(batches), chain)


@given(BATCHES, st.lists(HASHES, max_size=6))
def test_replayed_batches_change_nothing(
    batches: list[tuple[str, list[BlockEvent]]], chain: list[int]
) -> None:
    once, twice = ChainIndex(), ChainIndex()
    apply_all(once, batches)
    apply_all(twice, batches)
    apply_all(twice, batches)  # at-least-once delivery: the same (epoch, seq) again
    assert twice.lookup(chain).lengths() == once.lookup(chain).lengths()


@given(BATCHES, st.lists(st.lists(HASHES, max_size=6), max_size=4))
def test_a_snapshot_answers_as_the_index_did(
    batches: list[tuple[str, list[BlockEvent]]], chains: list[list[int]]
) -> None:
    live = PrefixIndex()
    seqs: dict[str, int] = {}
    for inst, events in batches:
        seqs[inst] = seqs.get(inst, 0) + 1
        live.apply_batch("dep", inst, 1, seqs[inst], events, 0.0)
    restored = PrefixIndex()
    restored.load_snapshot(live.snapshot())
    if not batches:
        return
    for chain in chains:
        assert restored.match_prefix("dep", "", chain) == live.match_prefix("dep", "", chain)


WORDS = st.lists(st.integers(0, 50), max_size=40)


@given(WORDS, WORDS, st.integers(1, 8), st.text(max_size=4))
def test_block_hash_chains_extend_their_prefix(
    prefix: list[int], rest: list[int], block: int, tenant: str
) -> None:
    short = block_hashes(prefix, block, tenant=tenant)
    long = block_hashes(prefix + rest, block, tenant=tenant)
    assert long[: len(short)] == short
    assert len(long) == len(prefix + rest) // block
    assert all(0 <= h < 2**64 for h in long)


@given(st.lists(st.integers(0, 50), min_size=8, max_size=24), st.text(min_size=1, max_size=4))
def test_tenants_never_share_a_chain(tokens: list[int], tenant: str) -> None:
    assert set(block_hashes(tokens, 4, tenant=tenant)).isdisjoint(block_hashes(tokens, 4))


CLASSES = ("interactive", "agent", "batch")
QUEUE_CONFIG = QueueConfig(
    classes=(
        ClassSpec("interactive", 30, max_queue_ms=5_000.0, max_queued=6),
        ClassSpec("agent", 20, max_queue_ms=30_000.0, max_queued=6),
        ClassSpec("batch", 10, max_queue_ms=300_000.0, max_queued=6),
    ),
    quantum=8,
    max_total=12,
)
OPS = st.lists(
    st.one_of(
        st.tuples(
            st.just("offer"),
            st.sampled_from(CLASSES),
            st.sampled_from(["", "t1", "t2"]),
            st.integers(1, 20),
            st.one_of(st.none(), st.floats(0, 60)),
        ),
        st.tuples(st.just("next"), st.integers(0, 4)),
        st.tuples(st.just("expire")),
        st.tuples(st.just("cancel"), st.integers(0, 40)),
        st.tuples(st.just("requeue")),
        st.tuples(st.just("wait"), st.floats(0, 10)),
    ),
    max_size=40,
)


@given(OPS)
def test_admission_queue_loses_and_duplicates_nothing(ops: list[tuple[object, ...]]) -> None:
    """Every admitted request leaves the queue exactly once (released, expired or
    cancelled), requeued ones included; a release never passes over a queued request of a
    higher class (no starvation promotion configured); bounds hold."""
    q = AdmissionQueue(QUEUE_CONFIG)
    prio = {c.name: c.priority for c in QUEUE_CONFIG.classes}
    now, n = 0.0, 0
    queued: dict[str, QueuedRequest] = {}
    released: list[QueuedRequest] = []
    for op in ops:
        if op[0] == "offer":
            _, cls, tenant, cost, deadline = op
            n += 1
            req = QueuedRequest(f"r{n}", str(tenant), str(cls), int(cost),  # type: ignore[call-overload]
                                None if deadline is None else now + float(deadline))  # type: ignore[arg-type]  # fmt: skip
            if isinstance(q.offer(req, now), Admitted):
                queued[req.request_id] = req
        elif op[0] == "next":
            waiting = {r.slo_class for r in queued.values()}
            out = q.next(now, int(op[1]))  # type: ignore[call-overload]
            for r in out:
                assert r.request_id in queued, "released twice, or never admitted"
                higher = [c for c in waiting if prio[c] > prio[r.slo_class]]
                assert not higher, f"{r.slo_class} released before queued {higher}"
                del queued[r.request_id]
                waiting = {x.slo_class for x in queued.values()}
            released.extend(out)
        elif op[0] == "expire":
            for r in q.expire(now):
                assert queued.pop(r.request_id, None) is not None
        elif op[0] == "cancel":
            rid = f"r{op[1]}"
            assert q.cancel(rid) == (queued.pop(rid, None) is not None)
        elif op[0] == "requeue" and released:
            r = released.pop()
            q.requeue(r, now)  # put back before its first byte: never refused
            queued[r.request_id] = r
        elif op[0] == "wait":
            now += float(op[1])  # type: ignore[arg-type]
        assert len(q) == len(queued)
        assert all(rid in q for rid in queued)
