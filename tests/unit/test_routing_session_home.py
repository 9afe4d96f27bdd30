"""session-home: every replica computes the same rendezvous home for a session."""

from __future__ import annotations

from collections import Counter

import pytest

from services.common.routing.plugins.affinity import rendezvous_home
from services.common.routing.types import Pick, RequestView
from services.common.scheduling import EndpointSpec, build_core
from tests.unit._routing_helpers import ctx, ep, make, req

IDS = [f"e{i}" for i in range(8)]


@pytest.mark.parametrize(
    ("ids", "expect_none"),
    [pytest.param([], True, id="no-ids"), pytest.param(["only"], False, id="one-id")],
)
def test_home_of_empty_and_single(ids: list[str], expect_none: bool) -> None:
    home = rendezvous_home("s", ids)
    assert (home is None) == expect_none
    if ids:
        assert home == ids[0]


def test_home_is_independent_of_order() -> None:
    for s in range(200):
        homes = {
            rendezvous_home(f"s{s}", order)
            for order in (IDS, IDS[::-1], sorted(IDS)[3:] + sorted(IDS)[:3])
        }
        assert len(homes) == 1


def test_losing_an_instance_moves_only_its_sessions() -> None:
    before = {s: rendezvous_home(f"s{s}", IDS) for s in range(2000)}
    after = {s: rendezvous_home(f"s{s}", [i for i in IDS if i != "e3"]) for s in range(2000)}
    moved = {s for s in before if before[s] != after[s]}
    assert moved == {s for s in before if before[s] == "e3"}


def test_homes_spread_over_the_instances() -> None:
    counts = Counter(rendezvous_home(f"session-{s}", IDS) for s in range(8000))
    assert set(counts) == set(IDS)
    assert max(counts.values()) < 1.25 * min(counts.values())


def test_long_session_ids_sharing_a_prefix_get_different_homes() -> None:
    base = "x" * 200
    homes = {rendezvous_home(f"{base}{s}", IDS) for s in range(200)}
    assert len(homes) == len(IDS)


@pytest.mark.parametrize(
    ("session", "scored"),
    [
        pytest.param("", 0, id="no-session-scores-nothing"),
        pytest.param("s1", 1, id="session-scores-its-home"),
    ],
)
def test_scorer(session: str, scored: int) -> None:
    plugin = make("session-home")
    cands = [ep(i) for i in IDS]
    out = plugin.score(ctx(), req(session_id=session), cands)
    assert len(out) == scored
    if scored:
        assert out == {rendezvous_home(session, IDS): 1.0}


def _replica() -> object:
    return build_core(
        [EndpointSpec(i, f"http://{i}") for i in IDS], perf_profile="test", block_size=16
    )


def test_two_replicas_without_shared_state_agree_on_every_session() -> None:
    """Two cores that share nothing send each session's turn to the same instance on an
    idle fleet (the default profile's tie-break), and the home is not always the lowest id."""
    a, b = _replica(), _replica()
    chosen = []
    for s in range(40):
        picks = []
        for core, rid in ((a, f"a{s}"), (b, f"b{s}")):
            v = RequestView(request_id=rid, prompt_tokens=64, session_id=f"sess-{s}", block_size=16)
            d = core.pick(v, 0.0, rid)  # type: ignore[attr-defined]
            assert isinstance(d, Pick), d
            core.release(rid)  # type: ignore[attr-defined]
            picks.append(d.decode.endpoint.instance_id)
        assert picks[0] == picks[1], (s, picks)
        chosen.append(picks[0])
    assert len(set(chosen)) > 2


@pytest.mark.parametrize(
    ("session", "parent", "home_of"),
    [
        pytest.param("sub", "root", "root", id="sub-agent-goes-to-its-parents-home"),
        pytest.param("root", "", "root", id="no-parent-own-home"),
        pytest.param("", "root", None, id="parent-without-session-scores-nothing"),
    ],
)
def test_sub_agent_home(session: str, parent: str, home_of: str | None) -> None:
    plugin = make("session-home")
    cands = [ep(i) for i in IDS]
    out = plugin.score(ctx(), req(session_id=session, parent_session_id=parent), cands)
    assert out == ({rendezvous_home(home_of, IDS): 1.0} if home_of else {})


def test_sub_agents_land_beside_their_parent_on_an_idle_fleet() -> None:
    """With the default profile, each sub-agent's first turn (a prompt with nothing in
    common with its parent's) goes where its parent session went, for every parent."""
    core = _replica()
    for s in range(20):
        placed = []
        for rid, sess, parent in ((f"p{s}", f"root-{s}", ""), (f"c{s}", f"sub-{s}", f"root-{s}")):
            v = RequestView(request_id=rid, prompt_tokens=64, session_id=sess,
                            parent_session_id=parent, block_size=16)  # fmt: skip
            d = core.pick(v, 0.0, rid)  # type: ignore[attr-defined]
            assert isinstance(d, Pick), d
            core.release(rid)  # type: ignore[attr-defined]
            placed.append(d.decode.endpoint.instance_id)
        assert placed[0] == placed[1], (s, placed)
