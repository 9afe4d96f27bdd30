"""Settling picks: a pick that fails before its first byte leaves no routed-prefix entry it
created; answered picks and entries that existed before stay."""

from __future__ import annotations

import pytest

from services.common.routing.plugins.prefix import ApproxPrefix
from services.common.routing.plugins.routed_index import RoutedPrefixIndex
from services.common.routing.types import Choice, Pick, RequestView
from services.common.scheduling import EndpointSpec, GatewayCore, build_core
from services.common.tokens import block_hashes
from tests.helpers.views import request_view
from tests.unit._routing_helpers import ep, make, req

H = block_hashes(list(range(1000, 1032)), 4)  # 8 chained blocks


def _pick(decode: str, prefill: str | None = None) -> Pick:
    return Pick(
        decode=Choice(ep(decode), 0.0),
        prefill=Choice(ep(prefill, role="prefill"), 0.0) if prefill else None,
        profile="p",
    )


def test_index_insert_reports_created_and_retract_spares_refreshed_entries() -> None:
    idx = RoutedPrefixIndex(ttl_s=100.0, max_entries=100)
    assert len(idx.insert(H[:3], "a", 0.0)) == 3
    created = idx.insert(H, "a", 1.0)
    assert created == [(h, "a") for h in H[3:]]  # the first 3 were only refreshed
    idx.insert(H[:5], "a", 2.0)  # a later pick refreshed blocks 3 and 4
    assert idx.retract(created, 1.0) == 3  # blocks 5..7 only
    assert idx.match(H, 3.0) == {"a": 5}


@pytest.mark.parametrize(
    ("before", "ok", "expected"),
    [
        ([], False, {}),
        ([], True, {"a": 8, "p": 8}),
        ([(H[:4], "a")], False, {"a": 4}),
        ([(H, "a")], False, {"a": 8}),
    ],
    ids=["failed-fresh", "answered", "failed-keeps-older-prefix", "failed-all-preexisting"],
)
def test_approx_prefix_settle(
    before: list[tuple[tuple[int, ...], str]], ok: bool, expected: dict[str, int]
) -> None:
    plugin: ApproxPrefix = make("approx-prefix", ttl_s=100.0)
    for hashes, iid in before:
        plugin.index.insert(hashes, iid, 0.0)
    r = req("r1", 32, block_hashes=tuple(H))
    pick = _pick("a", "p")
    plugin.on_pick(1.0, r, pick)
    plugin.on_settle(r, pick, ok)
    plugin.on_settle(r, pick, False)  # settled once: a second call changes nothing
    assert plugin.index.match(H, 2.0) == expected


def test_undo_records_are_bounded() -> None:
    plugin: ApproxPrefix = make("approx-prefix", ttl_s=100.0)
    plugin.undo_max_keys = 16
    for i in range(10):
        hashes = tuple(block_hashes(list(range(i * 100, i * 100 + 32)), 4))
        plugin.on_pick(1.0, req(f"r{i}", 32, block_hashes=hashes), _pick("a"))
    assert plugin._undo_keys <= 16 and len(plugin._undo) == 2


def view(rid: str) -> RequestView:
    return request_view(rid, hashes=H, block_size=4, max_tokens=4)


def _routed(core: GatewayCore) -> ApproxPrefix:
    hooks = core.scheduler.profiles["default"].post_pick
    return next(h for h in hooks if isinstance(h, ApproxPrefix))


@pytest.mark.parametrize(
    ("outcome", "kept"),
    [("first_token", True), ("abandon", False), ("release_only", True)],
    ids=["answered", "failed-before-first-byte", "reported-by-grpc-caller"],
)
def test_gateway_core_settles_picks(outcome: str, kept: bool) -> None:
    core = build_core([EndpointSpec("a", "http://a"), EndpointSpec("b", "http://b")])
    d = core.pick(view("r1"), 0.0, "r1.0")
    assert isinstance(d, Pick)
    chosen = d.decode.endpoint.instance_id
    if outcome == "first_token":
        core.first_token("r1.0")
    elif outcome == "abandon":
        assert core.abandon("r1.0")
    core.release("r1.0")
    assert not core.abandon("r1.0")  # settled and released: nothing left to undo
    matched = _routed(core).index.match(H, 1.0)
    assert (chosen in matched) is kept
