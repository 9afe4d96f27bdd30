"""Continuous-batching state machine of the engine simulator (pure: time is passed in).

A request is admitted (``submit``) into the waiting queue; ``step(now)`` plans one engine
step and returns its modelled duration and what it produced. The shell sleeps for the
duration (divided by its speedup) and then delivers the step's outputs, so tokens appear at
``now + duration``.

Per step (vLLM v1 / SGLang style): running decodes first (one token each), then chunks of
prompts already being prefilled, then new admissions from the waiting queue head (FCFS,
head-of-line blocking when the KV cache cannot hold the head), all within
``max_batched_tokens`` tokens and ``max_batch`` running sequences. A sequence reserves all
its KV blocks (prompt + max new tokens) at admission, so nothing is ever preempted.

Roles:
* ``aggregated`` — prefill then decode here.
* ``prefill`` — compute the prompt, emit one token and finish; the KV stays held until
  ``hand_off(rid, ready_at)`` is called (the decode side took it) and the modelled transfer
  has ended, or until ``hold_timeout_ms`` passes; then it is freed.
* ``decode`` — a request submitted with ``kv_transfer_ms`` reserves its blocks, waits that
  long (the modelled hand-off; no bytes move), then decodes starting from the token the
  prefill produced. Without ``kv_transfer_ms`` the decode instance prefills itself. With
  ``CoreConfig.decode_keeps_kv`` the received prompt becomes cached prefix blocks here and
  a hand-off lasts only the transfer of the prompt tokens not already resident.

vLLM-style remote prefill (any role, as vLLM's ``kv_both``): a request submitted with
``remote_prefill`` reserves its blocks, pulls the KV of the prompt tokens it does not hold
locally (``transfer_ms`` of those tokens), then recomputes the last prompt token itself and
samples its first token (vLLM discards the prefill's token). It reports ``prompt - 1``
cached tokens (local hits + pulled), as vLLM's scheduler does. The step that ends a pull
lists the request in ``StepResult.transferred`` (the shell tells the prefill peer it may
free). A request with ``hold_kv`` keeps its KV after finishing on any role.

Real KV bytes (``--kv-data-plane``): the shell pulls the bytes before it submits and passes
the modelled time that took (``pulled_ms``, or a reduced ``kv_transfer_ms``), so the modelled
hand-off lasts ``max(modelled transfer, real pull)``. A request with ``fetched_tokens`` (the
shell fetched that prefix from the KV-cache tier) counts them as cached, waits
``fetch_wait_ms`` before its first prefill chunk, and computes only the rest. A request
with ``tier_lookup`` whose leading blocks resident at submission were evicted while it
waited (:func:`~services.common.engine_core.core_types.lookup_due`) is not admitted at once: it leaves
the queue, :meth:`EngineCore.drain_lookups` hands the shell a :class:`Lookup`, and
:meth:`EngineCore.looked_up` (what the shell fetched) puts it back at the queue's head, to be
admitted with that as ``fetched_tokens`` (vLLM's KV connectors are asked for external
matches when the scheduler admits a request, not when it arrives).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import replace

from services.common.engine_core.core_types import (
    AdmissionError,
    CoreConfig,
    DecodeRun,
    EngineRole,
    Lookup,
    Request,
    SeqOutput,
    StepResult,
    _Seq,
    lookup_due,
)
from services.common.engine_core.kvcache import KVCache
from services.common.engine_core.prefill_plan import PrefillPlanner
from services.common.perfmodel import PerfProfile
from services.common.tokens import FIRST_WORD_ID, VOCAB_SIZE, block_hashes

__all__ = [
    "AdmissionError",
    "CoreConfig",
    "DecodeRun",
    "EngineCore",
    "EngineRole",
    "Lookup",
    "Request",
    "SeqOutput",
    "StepResult",
]


class EngineCore(PrefillPlanner):
    """One engine instance's scheduler. All times are in milliseconds on the caller's clock."""

    def __init__(self, config: CoreConfig, profile: PerfProfile, cache: KVCache) -> None:
        self.config = config
        self.profile = profile
        self.cache = cache
        self._waiting: deque[_Seq] = deque()
        self._running: dict[str, _Seq] = {}  # prefilling or decoding, insertion = FCFS
        self._transferring: dict[str, _Seq] = {}
        self._held: dict[str, float] = {}  # prefill role: rid -> free at (ms)
        self._looking: dict[str, _Seq] = {}  # out of the queue while the tier is asked
        self._lookups: list[Lookup] = []  # asked for, not drained by the shell yet
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.cached_tokens_total = 0
        self.finished_total = 0

    # -- admission -----------------------------------------------------------------------
    def check(self, prompt_len: int, max_new_tokens: int) -> None:
        """Raise ``AdmissionError`` if such a request can never run on this instance."""
        limit = self.profile.max_context
        if prompt_len <= 0:
            raise AdmissionError("the prompt is empty")
        if max_new_tokens <= 0:
            raise AdmissionError("max_new_tokens must be at least 1")
        if prompt_len + max_new_tokens > limit:
            raise AdmissionError(
                f"prompt ({prompt_len} tokens) plus max_new_tokens ({max_new_tokens}) exceeds "
                f"the context limit of {limit} tokens"
            )
        need = self.cache.blocks_for(prompt_len + max_new_tokens)
        if need > self.cache.running_blocks:
            raise AdmissionError(
                f"request needs {need} KV blocks; this instance has {self.cache.running_blocks}"
            )

    def submit(self, req: Request, now: float) -> None:
        """Queue a request. Raises ``AdmissionError`` (see ``check``) or ``ValueError`` for a
        duplicate id; nothing changes then."""
        self.check(len(req.prompt), req.max_new_tokens)
        if self.knows(req.rid):
            raise ValueError(f"duplicate request id {req.rid!r}")
        if req.block_hashes is not None:
            hashes = list(req.block_hashes)
        else:
            hashes = block_hashes(req.prompt, self.cache.block_size, tenant=req.tenant)
        s = _Seq(req, hashes, now)
        if req.tier_lookup:
            s.resident = self.cache.match(hashes)
        self._waiting.append(s)

    def drain_lookups(self) -> list[Lookup]:
        """The tier lookups asked for at admission since the last call (module doc)."""
        out, self._lookups = self._lookups, []
        return out

    def looked_up(self, rid: str, fetched_tokens: int, fetch_wait_ms: float) -> bool:
        """The shell's answer to ``rid``'s :class:`Lookup`: it fetched the KV of the prompt's
        ``fetched_tokens`` leading tokens (0: none; it computes them) and the modelled fetch
        still lasts ``fetch_wait_ms``. The request goes back to the queue's head. False when
        ``rid`` is not waiting for a lookup (aborted meanwhile)."""
        s = self._looking.pop(rid, None)
        if s is None:
            return False
        if fetched_tokens > s.req.fetched_tokens:
            s.req = replace(s.req, fetched_tokens=fetched_tokens, fetch_wait_ms=fetch_wait_ms)
        self._waiting.appendleft(s)
        return True

    def knows(self, rid: str) -> bool:
        return (
            rid in self._running
            or rid in self._transferring
            or rid in self._held
            or rid in self._looking
            or any(s.req.rid == rid for s in self._waiting)
        )

    def abort(self, rid: str) -> None:
        """Forget a request (client went away). Idempotent."""
        self._waiting = deque(s for s in self._waiting if s.req.rid != rid)
        self._running.pop(rid, None)
        self._transferring.pop(rid, None)
        self._held.pop(rid, None)
        self._looking.pop(rid, None)
        self.cache.release(rid)

    def hand_off(self, rid: str, free_at: float) -> bool:
        """Prefill role: the decode side takes the KV of ``rid``; free it at ``free_at``.
        False if ``rid`` holds no KV here (unknown, already freed)."""
        if rid not in self._held:
            return False
        self._held[rid] = free_at
        return True

    # -- observation ---------------------------------------------------------------------
    @property
    def num_running(self) -> int:
        return len(self._running) + len(self._transferring)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting) + len(self._looking)

    @property
    def num_held(self) -> int:
        return len(self._held)

    def pending_prefill_tokens(self) -> int:
        run = sum(s.prompt_len - s.computed for s in self._running.values())
        waiting = (*self._waiting, *self._looking.values())
        return run + sum(s.prompt_len - s.cached for s in waiting)

    def tokens_in_flight(self) -> int:
        decode = sum(
            s.req.max_new_tokens - s.n_gen
            for s in (
                *self._running.values(),
                *self._transferring.values(),
                *self._waiting,
                *self._looking.values(),
            )
        )
        return self.pending_prefill_tokens() + decode

    def next_wakeup(self, now: float) -> float | None:
        """Earliest time at which ``step`` will have something to do, or None if idle. Waiting
        sequences that ``step`` could not admit (no KV room) wait for a transfer to arrive or
        held KV to be freed when there is one."""
        if self._running:
            return now
        times = [s.ready_at for s in self._transferring.values()] + list(self._held.values())
        if times:
            return min(times)
        return now if self._waiting else None

    # -- the step ------------------------------------------------------------------------
    def step(self, now: float) -> StepResult | None:
        """Plan and account one step starting at ``now``; None when there is nothing to run."""
        outputs: list[SeqOutput] = []
        pulled: list[str] = []
        self._free_held(now)
        self._arrive_transfers(now, outputs, pulled)
        budget = self.config.max_batched_tokens
        decoding = [s for s in self._running.values() if s.computed >= s.prompt_len]
        decoding = decoding[:budget]
        budget -= len(decoding)
        chunks = self._plan_chunks(budget, now)
        if not decoding and not chunks:
            if outputs or pulled:
                return StepResult(0.0, tuple(outputs), 0, 0, tuple(pulled))
            return None
        ctx = sum(s.prompt_len + s.n_gen for s in decoding)
        duration = self.profile.step_ms([(n, s.computed) for s, n in chunks], len(decoding), ctx)
        end = now + duration
        mark = self.config.output_mark
        if mark is None or self.config.token_ids:
            for s in decoding:
                outputs.append(self._emit(s, 1, end))
        else:
            self._advance(decoding, mark, end, outputs)
        prefilled = 0
        for s, n in chunks:
            s.computed += n
            prefilled += n
            if s.computed >= s.prompt_len:
                self.cache.commit(s.req.rid, s.hashes)
                outputs.append(self._emit(s, 1, end))
        self.prompt_tokens_total += prefilled
        return StepResult(
            duration, tuple(outputs), prefilled, len(decoding), tuple(pulled), ctx, len(chunks)
        )

    # -- decode runs (the discrete-event simulator) --------------------------------------
    def decode_run(self, now: float, mark: int = 0) -> DecodeRun | None:
        """The steps from ``now`` that ``step`` would run as pure decodes changing nothing
        but token counts, as one :class:`DecodeRun`; None when the next step is not one.

        In such a step every running sequence is decoding, nothing can be admitted (none
        waiting, the batch full, or the queue's head does not fit the cache), no held KV is
        freed and no transfer arrives (both start before the earliest such time), and no
        sequence finishes or reaches ``mark`` generated tokens (0: no mark). The caller
        applies it with ``apply_run`` at its end, or at an earlier step's end with
        ``cut_run`` when a request was submitted meanwhile; steps then go on with ``step``.
        """
        if self.config.role is EngineRole.PREFILL or not self._running or self._looking:
            return None
        batch = len(self._running)
        if batch > self.config.max_batched_tokens:
            return None
        if self._waiting and batch < self.config.max_batch:
            if self.config.short_first_tokens > 0:
                return None  # a short prompt behind the head may be admitted: single steps
            head = self._waiting[0]
            total = self.cache.blocks_for(head.prompt_len + head.req.max_new_tokens)
            if self.cache.fits(head.hashes, total) is not False:
                return None
        steps = 1 << 62
        ctx = 0
        for s in self._running.values():
            n_gen, plen = s.n_gen, s.prompt_len
            left = s.req.max_new_tokens - n_gen - 1
            if n_gen < mark and mark - n_gen - 1 < left:
                left = mark - n_gen - 1
            if left < steps:
                steps = left
            if steps <= 0 or s.computed < plen:
                return None  # steps only falls: no run
            ctx += plen + n_gen
        times = [s.ready_at for s in self._transferring.values()] + list(self._held.values())
        if times:
            horizon = min(times)
            if horizon <= now:
                return None
            # the steps that start before the horizon (step 0 starts at now)
            steps = _count(
                steps, lambda j: now + self.profile.decode_steps_ms(batch, ctx, j) < horizon
            )
        return DecodeRun(now, batch, ctx, steps, self.profile.decode_steps_ms(batch, ctx, steps))

    def cut_run(self, run: DecodeRun, now: float) -> DecodeRun:
        """``run`` ending at its first step end at or after ``now`` (``run`` itself when that
        is its last step): a request submitted at ``now`` is admitted from there on."""
        ms = self.profile.decode_steps_ms
        keep = _count(run.steps, lambda j: run.start + ms(run.batch, run.context, j) < now)
        keep = max(1, keep)
        if keep >= run.steps:
            return run
        return DecodeRun(run.start, run.batch, run.context, keep, ms(run.batch, run.context, keep))

    def run_started(self, run: DecodeRun, now: float) -> int:
        """How many of ``run``'s steps have started by ``now`` (each adds its tokens when it
        starts, as ``step`` does)."""
        ms = self.profile.decode_steps_ms
        return _count(run.steps, lambda j: run.start + ms(run.batch, run.context, j) <= now)

    def apply_run(self, run: DecodeRun) -> tuple[str, ...]:
        """Account ``run``'s steps (one token per running sequence per step); the ids of the
        sequences that got ``run.steps`` tokens each."""
        k = run.steps
        ids = self.config.token_ids
        for s in self._running.values():
            if ids:
                s.generated.extend(_token(s.req.prompt, s.n_gen + i) for i in range(k))
            s.n_gen += k
        self.generation_tokens_total += k * run.batch
        return tuple(self._running)

    # -- internals -----------------------------------------------------------------------
    def _advance(self, decoding: list[_Seq], mark: int, end: float, out: list[SeqOutput]) -> None:
        """A token for each of ``decoding`` (no token ids kept); an output for those that
        finish or reach ``mark`` tokens only (``CoreConfig.output_mark``)."""
        quiet = 0
        prefill_role = self.config.role is EngineRole.PREFILL
        for s in decoding:
            n = s.n_gen + 1
            if n == mark or n >= s.req.max_new_tokens or prefill_role:
                out.append(self._emit(s, 1, end))
            else:
                s.n_gen = n
                quiet += 1
        self.generation_tokens_total += quiet

    def _admit(self, s: _Seq, now: float) -> bool:
        """Admit ``s`` (True), or leave it waiting (False: no room); True also when it left
        for a tier lookup (:meth:`_parked`)."""
        if s.req.tier_lookup and not s.looked_up:
            resident = self.cache.match(s.hashes)
            bs = self.cache.block_size
            if lookup_due(s.resident, resident, s.req.fetched_tokens, bs):
                s.looked_up = True
                self._looking[s.req.rid] = s
                self._lookups.append(Lookup(s.req.rid, tuple(s.hashes), resident))
                return True
        total = self.cache.blocks_for(s.prompt_len + s.req.max_new_tokens)
        alloc = self.cache.allocate(s.req.rid, s.hashes, total, s.req.tenant)
        if alloc is None:
            return False
        if s.req.remote_prefill:
            # Pull what is not resident here; the last prompt token is recomputed locally.
            local = min(alloc.cached_blocks * self.cache.block_size, s.prompt_len)
            missing = s.prompt_len - local
            modelled = self.profile.transfer_ms(missing) if missing else 0.0
            s.ready_at = now + max(0.0, modelled - s.req.pulled_ms)
            s.computed = s.cached = s.prompt_len - 1
            self.cached_tokens_total += s.cached
            self._transferring[s.req.rid] = s
            return True
        if s.req.kv_transfer_ms is not None and self.config.role is EngineRole.DECODE:
            s.computed = s.prompt_len
            s.cached = s.req.peer_cached_tokens
            s.ready_at = now + self._hand_off_ms(s, alloc.cached_blocks)
            self._transferring[s.req.rid] = s
            return True
        # At least one prompt token is always computed (it yields the first logits).
        local = alloc.cached_blocks * self.cache.block_size
        s.cached = min(max(local, s.req.fetched_tokens), s.prompt_len - 1)
        s.computed = s.cached
        self.cached_tokens_total += s.cached
        if s.req.fetched_tokens > local and s.req.fetch_wait_ms > 0:
            s.ready_at = now + s.req.fetch_wait_ms
            self._transferring[s.req.rid] = s
            return True
        self._running[s.req.rid] = s
        return True

    def _parked(self, rid: str) -> bool:
        """Admitted into a transfer or out for a tier lookup: no prefill chunk yet."""
        return rid in self._transferring or rid in self._looking

    def _hand_off_ms(self, s: _Seq, resident_blocks: int) -> float:
        """Decode role: how long the hand-off of ``s``'s KV lasts. With ``decode_keeps_kv``
        the blocks already resident here are not sent again (at most the shell's time)."""
        full = s.req.kv_transfer_ms
        assert full is not None
        if not self.config.decode_keeps_kv:
            return full
        local = min(resident_blocks * self.cache.block_size, s.prompt_len)
        return min(full, self.profile.transfer_ms(s.prompt_len - local))

    def _arrive_transfers(self, now: float, outputs: list[SeqOutput], pulled: list[str]) -> None:
        for rid, s in list(self._transferring.items()):
            if s.ready_at <= now and len(self._running) < self.config.max_batch:
                del self._transferring[rid]
                self._running[rid] = s
                if s.req.remote_prefill:
                    pulled.append(rid)  # the last prompt token is computed by this step
                elif s.req.fetched_tokens:
                    pass  # fetched from the tier: the rest of the prompt is computed here
                else:
                    if self.config.decode_keeps_kv:
                        self.cache.commit(rid, s.hashes)  # the received prompt is cached
                    outputs.append(self._emit(s, 1, now))  # the first token came with the KV

    def _free_held(self, now: float) -> None:
        for rid, free_at in list(self._held.items()):
            if free_at <= now:
                del self._held[rid]
                self.cache.release(rid)

    def _emit(self, s: _Seq, n: int, end: float) -> SeqOutput:
        done = s.n_gen
        new: tuple[int, ...] = ()
        if self.config.token_ids:
            new = (
                (_token(s.req.prompt, done),)
                if n == 1
                else tuple(_token(s.req.prompt, done + i) for i in range(n))
            )
            s.generated.extend(new)
        s.n_gen = done + n
        self.generation_tokens_total += n
        prefill_role = self.config.role is EngineRole.PREFILL
        finished = prefill_role or s.n_gen >= s.req.max_new_tokens
        rid = s.req.rid
        if finished:
            self._running.pop(rid, None)
            self.finished_total += 1
            if s.req.hold_kv:
                # Hold the KV for the decode side (until hand_off, or a timeout).
                self._held[rid] = end + self.config.hold_timeout_ms
            else:
                self.cache.release(rid)
        return SeqOutput(rid, new, s.prompt_len, s.cached, s.n_gen, finished)


def _count(n: int, before: Callable[[int], bool]) -> int:
    """How many of 0..n-1 satisfy ``before``, a predicate true up to some index, then false."""
    lo, hi = 0, n  # before(j) for j < lo; not before(j) for j >= hi
    while lo < hi:
        mid = (lo + hi) // 2
        if before(mid):
            lo = mid + 1
        else:
            hi = mid
    return lo


def _token(prompt: Sequence[int], index: int) -> int:
    """Deterministic generated token: depends on the prompt's last tokens and the position."""
    seed = (prompt[-1] if prompt else 0) * 1_000_003 + len(prompt) * 7_919 + index * 104_729
    return seed % (VOCAB_SIZE - FIRST_WORD_ID) + FIRST_WORD_ID
