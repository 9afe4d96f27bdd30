"""Instance failures in the simulator: the dead engine's streaming requests fail, the others
are retried elsewhere, the gateways stop picking it once membership drops it."""

from __future__ import annotations

import pytest

from services.common.bench.traces import Trace, TraceRequest
from services.sim.config import SimConfig, SimConfigError
from services.sim.run import Simulation

DEAD_AT_S, DETECT_S = 2.0, 1.0


def _trace() -> Trace:
    """60 requests of 8 distinct blocks over 6 s, 200 tokens out each: at 2 s every engine
    streams some and queues others (its KV holds about four at once)."""
    reqs = tuple(
        TraceRequest(i, i + 1, 0.1 * i, 8 * 512, 200, tuple(range(100 * i + 1, 100 * i + 9)))
        for i in range(60)
    )
    return Trace("t", "mooncake", reqs)


def _run(**over: object) -> Simulation:
    fields: dict[str, object] = {"engines": 4, "kv_blocks": 300, "block_size": 64,
                                 "fail_at_s": DEAD_AT_S, "fail_detect_s": DETECT_S, **over}  # fmt: skip
    sim = Simulation(SimConfig(**fields), _trace())  # type: ignore[arg-type]
    sim.run()
    return sim


def test_a_dead_engines_requests_fail_once_streaming_and_are_retried_before() -> None:
    sim = _run()
    rec = sim.failure
    assert rec is not None and len(rec.instances) == 1
    (dead,) = rec.instances
    assert sim.engines[dead].failed and sim.engines[dead].removed
    assert rec.at_ms == DEAD_AT_S * 1000.0 and rec.detected_ms == rec.at_ms + DETECT_S * 1000.0
    assert len(sim.order) == 60 and all(r.endings == 1 for r in sim.order)
    failed = [r for r in sim.order if r.error is not None]
    assert {r.rid for r in failed} == set(rec.failed_rids) and rec.failed == len(failed) > 0
    for r in failed:  # streaming when it died, or out of retries
        assert r.first is not None or r.attempts == sim.cfg.retries
        assert dead in (r.error or "")
    retried = [r for r in sim.order if r.attempts]
    assert retried and rec.retried >= len(retried)
    for r in retried:
        assert dead in r.view.exclude
        assert r.error is not None or (r.target != dead and r.last is not None)
    assert rec.lost_blocks > 0
    # once membership dropped it, nobody picks it
    assert not [r for r in sim.order if r.arrival > rec.detected_ms and r.target == dead]
    # nothing else failed
    assert all(r.error is None for r in sim.order if r.target != dead and not r.attempts)


def test_failures_are_deterministic() -> None:
    def outcome(sim: Simulation) -> list[tuple[object, ...]]:
        return [(r.rid, r.target, r.error, r.first, r.last, r.attempts) for r in sim.order]

    assert outcome(_run()) == outcome(_run())


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_a_dead_pd_engine_fails_or_retries_what_it_was_part_of(role: str) -> None:
    sim = _run(engines=0, prefill=2, decode=2, fail_role=role)
    rec = sim.failure
    assert rec is not None and len(rec.instances) == 1
    (dead,) = rec.instances
    assert sim.engines[dead].role == role and sim.engines[dead].failed
    assert len(sim.order) == 60 and all(r.endings == 1 for r in sim.order)
    retried = [r for r in sim.order if r.attempts]
    assert retried and rec.retried >= len(retried)
    assert all(dead in r.view.exclude and r.rid == f"r{r.index}.{r.attempts}" for r in retried)
    done = [r for r in sim.order if r.error is None]
    # what an engine still ran for a call given up counts for nothing: every completed
    # request got its tokens once, from the pair it completed on
    assert all(r.ntok == r.out and r.last is not None for r in done)
    late = [r for r in done if r.arrival > rec.detected_ms]
    assert late and not [r for r in late if dead in (r.target, r.home)]
    if role == "prefill":  # nothing streams from a prefill engine: all retried, none failed
        assert rec.failed == 0 and len(done) == 60
    else:  # its streams break; whatever completed on it completed before it died
        assert rec.failed > 0 and all(dead in (r.error or "") for r in sim.order if r.error)
        assert all(r.last is not None and r.last <= rec.at_ms for r in done if r.home == dead)


def test_pd_failures_are_deterministic() -> None:
    def outcome(sim: Simulation) -> list[tuple[object, ...]]:
        return [(r.rid, r.target, r.home, r.error, r.first, r.last) for r in sim.order]

    pd = {"engines": 0, "prefill": 2, "decode": 2}
    assert outcome(_run(**pd)) == outcome(_run(**pd))


def test_without_retries_every_request_on_it_fails() -> None:
    sim = _run(retries=0)
    rec = sim.failure
    assert rec is not None and rec.retried == 0 and rec.failed > 0
    assert not any(r.attempts for r in sim.order)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"fail_at_s": -1.0}, "fail-at-s"),
        ({"fail_at_s": 1.0, "fail_count": 4}, "fail-count"),
        ({"fail_at_s": 1.0, "fail_count": 0}, "fail-count"),
        ({"fail_at_s": 1.0, "prefill": 2, "decode": 2, "fail_count": 4}, "fail-count"),
        ({"fail_at_s": 1.0, "prefill": 1, "decode": 3, "fail_role": "prefill"}, "fail-count"),
        ({"fail_at_s": 1.0, "fail_role": "decode"}, "fail-role"),
        ({"fail_at_s": 1.0, "prefill": 2, "decode": 2, "fail_role": "worker"}, "fail-role"),
        ({"fail_at_s": 1.0, "fail_detect_s": -1.0}, "fail-detect-s"),
        ({"fail_at_s": 1.0, "retries": -1}, "retries"),
    ],
    ids=["negative-time", "all-engines", "none", "pd-all", "pd-whole-role", "role-aggregated",
         "role-unknown", "negative-detect", "negative-retries"],
)  # fmt: skip
def test_bad_failure_config_is_refused(fields: dict[str, object], message: str) -> None:
    with pytest.raises(SimConfigError, match=message):
        SimConfig(**{"engines": 4, **fields}).validate()  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", ["lru", "retention", "prefetch"])
def test_with_agent_memory_a_dead_engines_sessions_are_followed(mode: str) -> None:
    """Sixteen sessions over 4 engines; their second turns all arrive at 30 s, when one
    engine dies (those on it are in prefill: retried elsewhere), their third at 60 s."""
    rows = []
    for k in range(16):
        chain = tuple(range(100 * k + 1, 100 * k + 9))
        rows += [(k * 0.5, chain[:6]), (30.0, chain[:7]), (60.0 + k * 0.5, chain)]
    reqs = tuple(
        TraceRequest(i, i + 1, t, len(h) * 512, 50, h) for i, (t, h) in enumerate(sorted(rows))
    )
    cfg = SimConfig(engines=4, kv_blocks=400, block_size=64, agent_memory=mode,
                    fail_at_s=30.0, fail_detect_s=DETECT_S)  # fmt: skip
    sim = Simulation(cfg, Trace("t", "mooncake", reqs))
    sim.run()
    assert len(sim.order) == 48 and all(r.endings == 1 and r.error is None for r in sim.order)
    retried = [r for r in sim.order if r.attempts]
    assert retried and all(r.arrival == 30_000.0 for r in retried)
    assert sim.memory is not None
    resumed = [r.index for r in sim.memory.resumes]
    assert len(resumed) == len(set(resumed)) == 32  # every later turn once, retried or not
    after = sim.memory.summary()["after_failure"]
    # the sessions homed on the dead engine, each followed once: the retried turns
    assert after["sessions"] == after["resumed_turns"] == len(retried)
    if mode == "lru":  # nothing but the dead GPU held their prefixes
        assert after["reuse_ratio"] == 0.0
