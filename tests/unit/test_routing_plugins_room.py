"""decode-room: P/D decode picks kept to decode engines with KV room for the turn."""

from __future__ import annotations

from typing import Any

import pytest

from services.common.routing.types import Choice, EndpointSnapshot, EndpointView, Pick
from tests.unit._routing_helpers import ctx, ep, make, req


def dec(iid: str, usage: float, cap: int = 1000, **kw: Any) -> EndpointView:
    return ep(iid, role="decode", kv_usage=usage, kv_capacity_tokens=cap, **kw)


def pick_on(e: EndpointView, prefill: EndpointView | None = None) -> Pick:
    return Pick(Choice(e, 1.0), Choice(prefill, 1.0) if prefill else None, "default")


@pytest.mark.parametrize(
    ("cands", "prompt", "max_tokens", "kept"),
    [
        ([dec("a", 0.9), dec("b", 0.5), dec("c", 0.2)], 300, 100, ["b", "c"]),
        ([dec("a", 0.9), dec("b", 0.5)], 400, 100, ["b"]),  # exactly fits: 500 free
        ([dec("a", 0.1), dec("b", 0.2)], 100, 0, ["a", "b"]),  # every one fits
        ([dec("a", 0.9), dec("b", 0.8), dec("c", 0.8)], 600, 0, ["b", "c"]),  # none: most room
        ([dec("a", 0.9), dec("b", 0.9, cap=0)], 600, 0, ["b"]),  # capacity unknown: kept
        ([ep("w1", kv_usage=0.99, kv_capacity_tokens=10), ep("w2")], 600, 0, ["w1", "w2"]),
        ([dec("a", 0.9)], 600, 0, ["a"]),  # a single candidate is never removed
        ([dec("a", 0.9), dec("b", 1.5), dec("c", -1.0, cap=500)], 400, 0, ["c"]),  # clamped
    ],
    ids=[
        "drops-full",
        "exact-fit",
        "all-fit",
        "none-fit-most-room",
        "unknown-capacity-kept",
        "aggregated-untouched",
        "single",
        "usage-clamped",
    ],
)
def test_filter_keeps_decode_engines_with_room(
    cands: list[EndpointView], prompt: int, max_tokens: int, kept: list[str]
) -> None:
    room = make("decode-room")
    got = room.filter(ctx(), req(prompt_tokens=prompt, max_tokens=max_tokens), cands)
    assert [e.instance_id for e in got] == kept


@pytest.mark.parametrize(
    ("share", "kept"),
    [(1.0, ["b"]), (0.5, ["a", "b"]), (0.0, ["a", "b"])],
    ids=["whole-output", "half", "allocated-as-generated"],
)
def test_output_share_sets_what_a_turn_reserves(share: float, kept: list[str]) -> None:
    room = make("decode-room", output_share=share)
    cands = [dec("a", 0.6), dec("b", 0.2)]  # 400 and 800 free
    got = room.filter(ctx(), req(prompt_tokens=300, max_tokens=200), cands)
    assert [e.instance_id for e in got] == kept


@pytest.mark.parametrize(
    ("settle", "at", "kept"),
    [
        (False, 1.0, ["b"]),  # the earlier turn still counts against a
        (True, 1.0, ["a", "b"]),  # it answered: its KV is in a's reported usage
        (False, 200.0, ["a", "b"]),  # past pending_ttl_s: forgotten
    ],
    ids=["pending", "settled", "expired"],
)
def test_unanswered_picks_count_against_their_decode_engine(
    settle: bool, at: float, kept: list[str]
) -> None:
    room = make("decode-room", pending_ttl_s=120.0)
    a, b = dec("a", 0.2), dec("b", 0.5)  # 800 and 500 free
    first = req("r1", prompt_tokens=400)
    room.on_pick(0.0, first, pick_on(a, ep("p", role="prefill")))
    if settle:
        room.on_settle(first, pick_on(a), ok=True)
    room._pending.expire(at)
    got = room.filter(ctx(now=at), req("r2", prompt_tokens=450), [a, b])
    assert [e.instance_id for e in got] == kept


def test_a_pick_on_a_worker_counts_nowhere() -> None:
    room = make("decode-room")
    room.on_pick(0.0, req("r1", prompt_tokens=900), pick_on(ep("w")))
    assert not any(room._pending.totals.values())


@pytest.mark.parametrize(
    ("view", "free"),
    [
        (ep("a", kv_usage=0.25, kv_capacity_tokens=1000), 750),
        (ep("a", kv_usage=0.25), None),
        (ep("a", kv_usage=1.2, kv_capacity_tokens=1000), 0),
    ],
    ids=["reported", "unknown", "over-full"],
)
def test_endpoint_free_tokens(view: EndpointView, free: int | None) -> None:
    assert view.kv_free_tokens == free


@pytest.mark.parametrize(
    ("change", "roles"),
    [
        (ep("b", running=3), {"worker"}),
        (ep("b", role="decode"), {"worker", "decode"}),
        (ep("zz", role="decode"), {"worker"}),  # not in the snapshot: ignored
    ],
    ids=["load-change", "role-change", "unknown-id"],
)
def test_snapshot_roles_follow_replaced_views(change: EndpointView, roles: set[str]) -> None:
    snap = EndpointSnapshot([ep("a"), ep("b")])
    assert snap.roles() == {"worker"}
    assert snap.replaced([change], 1).roles() == roles
    assert snap.subset([0]).roles() == {"worker"}
