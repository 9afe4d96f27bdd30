"""Continuous-batching core: budgets, chunked prefill, caching, roles, admission."""

from __future__ import annotations

import pytest

from services.common.engine_core.core import (
    AdmissionError,
    CoreConfig,
    EngineCore,
    EngineRole,
    Request,
    StepResult,
)
from services.common.engine_core.kvcache import KVCache
from services.common.perfmodel import get_profile
from services.common.tokens import block_hashes

PROFILE = get_profile("test")


def make(
    role: EngineRole = EngineRole.AGGREGATED,
    *,
    max_batch: int = 8,
    budget: int = 256,
    blocks: int = 1024,
    block_size: int = 16,
) -> EngineCore:
    cfg = CoreConfig(role=role, max_batch=max_batch, max_batched_tokens=budget)
    return EngineCore(cfg, PROFILE, KVCache(blocks, block_size))


def req(rid: str, n: int, out: int = 4, *, base: int = 1000, **kw: object) -> Request:
    return Request(rid, tuple(range(base, base + n)), out, **kw)  # type: ignore[arg-type]


def run(core: EngineCore, now: float = 0.0, limit: int = 10_000) -> tuple[float, list[StepResult]]:
    """Step until idle; returns the end time and the steps."""
    steps: list[StepResult] = []
    for _ in range(limit):
        wake = core.next_wakeup(now)
        if wake is None:
            return now, steps
        now = max(now, wake)
        res = core.step(now)
        if res is not None:
            steps.append(res)
            now += res.duration_ms
    raise AssertionError("core did not go idle")


def ttft(core: EngineCore, r: Request, now: float = 0.0) -> tuple[float, int]:
    core.submit(r, now)
    t = now
    while True:
        res = core.step(t)
        assert res is not None
        t += res.duration_ms
        for o in res.outputs:
            if o.rid == r.rid and o.tokens:
                run(core, t)
                return t - now, o.cached_tokens


def test_chunked_prefill_respects_token_budget() -> None:
    core = make(budget=100)
    core.submit(req("a", 250, out=2), 0.0)
    _, steps = run(core)
    prefill = [s.prefill_tokens for s in steps if s.prefill_tokens]
    assert prefill == [100, 100, 50]
    assert all(s.prefill_tokens + s.decode_tokens <= 100 for s in steps)


def test_max_batch_bounds_running_sequences() -> None:
    core = make(max_batch=2)
    for i in range(5):
        core.submit(req(f"r{i}", 10, out=3, base=i * 100), 0.0)
    res = core.step(0.0)
    assert res is not None
    assert core.num_running == 2 and core.num_waiting == 3
    run(core, res.duration_ms)
    assert core.num_running == 0 and core.finished_total == 5


def test_every_request_gets_exactly_max_new_tokens() -> None:
    core = make()
    for i, out in enumerate([1, 5, 17]):
        core.submit(req(f"r{i}", 40, out=out, base=i * 100), 0.0)
    _, steps = run(core)
    got: dict[str, int] = {}
    finished = set()
    for s in steps:
        for o in s.outputs:
            got[o.rid] = got.get(o.rid, 0) + len(o.tokens)
            if o.finished:
                finished.add(o.rid)
    assert got == {"r0": 1, "r1": 5, "r2": 17} and finished == set(got)
    assert core.generation_tokens_total == 23 and core.cache.usage == 0.0


def test_repeated_prompt_is_cached_and_first_token_comes_sooner() -> None:
    core = make(budget=4096)
    cold, cold_cached = ttft(core, req("a", 2000))
    warm, warm_cached = ttft(core, req("b", 2000), 1e6)
    assert cold_cached == 0 and warm_cached == 2000 - 1  # the last token is recomputed
    assert warm < cold


def test_partial_prefix_hit_reports_whole_blocks() -> None:
    core = make(block_size=16)
    ttft(core, req("a", 100))
    other = Request("b", tuple(range(1000, 1040)) + tuple(range(5000, 5060)), 2)
    _, cached = ttft(core, other, 1e6)
    assert cached == 32  # 40 shared tokens = 2 full blocks of 16


@pytest.mark.parametrize(
    ("n", "out", "match"),
    [
        (0, 4, "empty"),
        (10, 0, "max_new_tokens"),
        (32_000, 1_000, "context limit"),
        (500, 600, "KV blocks"),
    ],
    ids=["empty", "no-output", "over-context", "over-cache"],
)
def test_admission_refuses_what_can_never_fit(n: int, out: int, match: str) -> None:
    core = make(blocks=64, block_size=16)  # 1024 tokens of KV
    with pytest.raises(AdmissionError, match=match):
        core.submit(req("x", n, out=out), 0.0)
    assert core.num_waiting == 0


def test_queue_waits_for_cache_space_instead_of_failing() -> None:
    core = make(blocks=10, block_size=16)  # 160 tokens
    core.submit(req("a", 100, out=20), 0.0)
    core.submit(req("b", 100, out=20, base=5000), 0.0)
    res = core.step(0.0)
    assert res is not None and core.num_running == 1 and core.num_waiting == 1
    run(core, res.duration_ms)
    assert core.finished_total == 2


def test_prefill_role_returns_one_token_and_holds_kv_until_hand_off() -> None:
    core = make(EngineRole.PREFILL)
    core.submit(req("a", 64, out=50, hold_kv=True), 0.0)
    t, steps = 0.0, []
    while core.num_running or core.num_waiting:
        res = core.step(t)
        assert res is not None
        steps.append(res)
        t += res.duration_ms
    outs = [o for s in steps for o in s.outputs]
    assert [len(o.tokens) for o in outs] == [1] and outs[0].finished
    assert core.cache.usage > 0 and core.num_held == 1
    assert core.hand_off("a", t + 5.0)
    core.step(t + 1.0)
    assert core.num_held == 1  # transfer still under way
    core.step(t + 5.0)
    assert core.num_held == 0 and core.cache.usage == 0.0
    assert not core.hand_off("a", t + 10.0)


def test_prefill_role_frees_unclaimed_kv_after_timeout() -> None:
    core = make(EngineRole.PREFILL)
    core.submit(req("a", 64, out=5, hold_kv=True), 0.0)
    end, _ = run(core)
    assert core.num_held == 0 and end >= core.config.hold_timeout_ms


def test_decode_role_waits_for_transfer_then_decodes_without_prefill() -> None:
    core = make(EngineRole.DECODE)
    transfer = PROFILE.transfer_ms(300)
    core.submit(req("a", 300, out=3, kv_transfer_ms=transfer, peer_cached_tokens=128), 0.0)
    assert core.step(0.0) is None  # admitted, KV in flight, nothing to compute
    assert core.next_wakeup(0.0) == pytest.approx(transfer)
    _, steps = run(core, 0.0)
    assert sum(s.prefill_tokens for s in steps) == 0
    outs = [o for s in steps for o in s.outputs]
    assert sum(len(o.tokens) for o in outs) == 3 and outs[-1].finished
    assert outs[0].cached_tokens == 128


@pytest.mark.parametrize(
    ("keeps", "cached_after", "second_wait"),
    [
        pytest.param(False, 0, PROFILE.transfer_ms(320), id="default-whole-prompt-nothing-kept"),
        pytest.param(True, 288, PROFILE.transfer_ms(320 - 288), id="keeps-kv-moves-only-the-rest"),
    ],
)
def test_decode_role_keeps_received_kv(keeps: bool, cached_after: int, second_wait: float) -> None:
    """A session's next turn (the first turn's 300 tokens + 20 more) on the same decode
    engine: with ``decode_keeps_kv`` the first hand-off's full blocks (288 of 300 tokens at
    16 per block) are cached there and the second hand-off moves only the other 32 tokens."""
    cfg = CoreConfig(role=EngineRole.DECODE, max_batch=8, decode_keeps_kv=keeps)
    core = EngineCore(cfg, PROFILE, KVCache(1024, 16))
    core.submit(req("t1", 300, out=2, kv_transfer_ms=PROFILE.transfer_ms(300)), 0.0)
    end, _ = run(core, 0.0)
    second = req("t2", 320, out=2, kv_transfer_ms=PROFILE.transfer_ms(320))
    hashes = block_hashes(second.prompt, 16)
    assert core.cache.match(hashes) * 16 == cached_after
    core.submit(second, end)
    assert core.step(end) is None  # admitted, its KV in flight
    assert core.next_wakeup(end) == pytest.approx(end + second_wait)
    _, steps = run(core, end)
    assert sum(s.prefill_tokens for s in steps) == 0
    assert [o.finished for s in steps for o in s.outputs][-1]


@pytest.mark.parametrize(
    ("short_first", "short_before_long"),
    [pytest.param(0, False, id="fcfs-short-waits"), pytest.param(64, True, id="short-first")],
)
def test_short_prompts_prefill_first(short_first: int, short_before_long: bool) -> None:
    """A 2,000-token prompt is prefilling (256-token chunks) when a 40-token one arrives:
    FCFS gives the running prompt the budget until it is done; ``short_first_tokens``
    admits the short one at once and gives it its chunk first."""
    cfg = CoreConfig(max_batch=8, max_batched_tokens=256, short_first_tokens=short_first)
    core = EngineCore(cfg, PROFILE, KVCache(1024, 16))
    core.submit(req("long", 2000, out=1), 0.0)
    res = core.step(0.0)
    assert res is not None
    core.submit(req("short", 40, out=1, base=9000), res.duration_ms)
    firsts: dict[str, float] = {}
    now = res.duration_ms
    while len(firsts) < 2:
        res = core.step(now)
        assert res is not None
        now += res.duration_ms
        for o in res.outputs:
            firsts.setdefault(o.rid, now)
    assert (firsts["short"] < firsts["long"]) is short_before_long


def test_decode_role_without_peer_prefills_itself() -> None:
    core = make(EngineRole.DECODE)
    core.submit(req("a", 300, out=2), 0.0)
    _, steps = run(core)
    assert sum(s.prefill_tokens for s in steps) == 300


def test_abort_frees_everything() -> None:
    core = make()
    core.submit(req("a", 300, out=100), 0.0)
    core.step(0.0)
    core.abort("a")
    assert core.num_running == 0 and core.cache.usage == 0.0 and core.step(1.0) is None


def test_decode_steps_get_slower_with_more_sequences() -> None:
    def first_decode_step(n_seqs: int) -> float:
        core = make(max_batch=64, budget=100_000, blocks=8192)
        for i in range(n_seqs):
            core.submit(req(f"r{i}", 2000, out=3, base=i * 10_000), 0.0)
        core.step(0.0)  # all prefills
        res = core.step(1e6)
        assert res is not None and res.decode_tokens == n_seqs and res.prefill_tokens == 0
        return res.duration_ms

    assert first_decode_step(1) < first_decode_step(8) < first_decode_step(32)


@pytest.mark.parametrize(
    ("local_tokens", "role"),
    [(0, EngineRole.DECODE), (256, EngineRole.DECODE), (0, EngineRole.AGGREGATED)],
    ids=["nothing-local", "256-local", "aggregated-kv-both"],
)
def test_remote_prefill_pulls_missing_kv_then_recomputes_the_last_token(
    local_tokens: int, role: EngineRole
) -> None:
    core = make(role)
    if local_tokens:  # a previous request left this prefix resident here
        core.submit(req("warm", local_tokens + 1, out=1), 0.0)
        run(core)
    t0 = 1000.0
    prompt_before = core.prompt_tokens_total
    core.submit(req("a", 300, out=3, remote_prefill=True), t0)
    assert core.step(t0) is None  # admitted; KV in flight, nothing to compute
    assert core.next_wakeup(t0) == pytest.approx(t0 + PROFILE.transfer_ms(300 - local_tokens))
    _, steps = run(core, t0)
    assert [r for s in steps for r in s.transferred] == ["a"]
    assert core.prompt_tokens_total - prompt_before == 1  # only the last prompt token
    outs = [o for s in steps for o in s.outputs]
    assert sum(len(o.tokens) for o in outs) == 3 and outs[-1].finished
    assert {o.cached_tokens for o in outs} == {299}  # local + pulled, as vLLM reports
    assert core.cache.usage == 0.0


def test_hold_kv_on_an_aggregated_engine_keeps_the_kv_until_hand_off() -> None:
    core = make()
    core.submit(req("a", 64, out=1, hold_kv=True), 0.0)
    t = 0.0
    while core.num_running or core.num_waiting:
        res = core.step(t)
        assert res is not None
        t += res.duration_ms
    assert core.num_held == 1 and core.cache.usage > 0
    assert core.hand_off("a", t)
    core.step(t)
    assert core.num_held == 0 and core.cache.usage == 0.0


@pytest.mark.parametrize("wait_ms", [0.0, 40.0], ids=["no-wait", "modelled-wait"])
def test_tier_fetched_prefix_counts_as_cached_and_only_the_rest_is_computed(
    wait_ms: float,
) -> None:
    core = make(block_size=16)
    r = req("t", 100, 3, fetched_tokens=64, fetch_wait_ms=wait_ms)
    core.submit(r, 0.0)
    first = core.step(0.0)
    if wait_ms:  # admitted, then nothing until the modelled fetch has ended
        assert first is None and core.next_wakeup(0.0) == wait_ms
    else:
        assert first is not None and first.prefill_tokens == 100 - 64
    _, steps = run(core, 0.0 if first is None else first.duration_ms)
    outs = [o for s in ([first] if first else []) + steps for o in s.outputs if o.rid == "t"]
    assert outs[-1].cached_tokens == 64 and outs[-1].completion_tokens == 3
    assert core.prompt_tokens_total == 100 - 64
    # every full prompt block, the fetched ones included, is now cached here
    assert core.cache.match(block_hashes(r.prompt, 16)) == 100 // 16
