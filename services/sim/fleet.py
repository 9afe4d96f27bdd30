"""The simulated engines: one :class:`services.common.engine_core.core.EngineCore` per instance, the
same continuous-batching core and timing model the engine simulator's HTTP server runs.

:class:`Engines` only holds the cores and answers "step this instance now": the loop
(:mod:`services.sim.run`) turns a step into a ``done`` event at ``now + duration`` and a
wake-up into a ``wake`` event. Steps that would only add a token to every running sequence
are one :class:`~services.common.engine_core.core.DecodeRun` (one ``done`` event for all of them, ended
early by a submit: :meth:`Engines.interrupt`); the cores keep token counts, not token ids.
Instance ids are ``worker-i`` (aggregated), ``prefill-i`` and ``decode-i``, the roles the
gateway knows them by.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from services.common.engine_core.core import (
    CoreConfig,
    DecodeRun,
    EngineCore,
    EngineRole,
    StepResult,
)
from services.common.engine_core.kvcache import KVCache
from services.common.engine_core.steptrace import StepTrace
from services.common.perfmodel import PerfProfile
from services.common.scheduling import EndpointSpec, LoadReport

__all__ = ["Engines", "Instance"]

_GATEWAY_ROLE = {
    EngineRole.AGGREGATED: "worker",
    EngineRole.PREFILL: "prefill",
    EngineRole.DECODE: "decode",
}


@dataclass(slots=True)
class Instance:
    iid: str
    role: str  # the gateway's name of the role: worker, prefill, decode
    core: EngineCore
    busy: bool = False  # a step is running (its ``done`` event is queued)
    wake_at: float | None = None  # a queued ``wake`` event's time
    trace: StepTrace | None = None  # per-step records (no decode runs then)
    run: DecodeRun | None = None  # the decode run in progress (its ``done`` is queued)
    ready: bool = True  # serving (False: started by the autoscaler, not up yet)
    retiring: bool = False  # draining: the gateways send it nothing new
    removed: bool = False  # gone from the fleet (drained, or stopped while starting)
    failed: bool = False  # died (services/sim/failures.py): removed without a drain

    @property
    def idle(self) -> bool:
        c = self.core
        return not self.busy and not c.num_running and not c.num_waiting and not c.num_held

    @property
    def spec(self) -> EndpointSpec:
        return EndpointSpec(self.iid, f"http://{self.iid}", role=self.role)  # type: ignore[arg-type]


class Engines:
    """The fleet's engine cores, keyed by instance id (insertion order = id order)."""

    def __init__(
        self,
        roles: list[EngineRole],
        perf: PerfProfile,
        kv_blocks: int,
        block_size: int,
        mark: int = 0,
        batched: bool = True,
        decode_keeps_kv: bool = False,
        short_first_tokens: int = 0,
        running_blocks: int | None = None,
        max_batch: int = 256,
        max_batched_tokens: int = 8192,
    ) -> None:
        """``mark``: a decode run stops before a sequence's ``mark``-th token (the shell
        acts on it: the first streamed chunk), and a step outputs only the sequences whose
        first token it made, that reached ``mark`` tokens or finished
        (``CoreConfig.output_mark``); ``batched=False``: one event per step;
        ``decode_keeps_kv``: decode engines cache the KV they receive, ``short_first_tokens``:
        short prompts are prefilled first (both :class:`CoreConfig` settings);
        ``running_blocks``: the KV running sequences may hold (:class:`KVCache`);
        ``max_batch``, ``max_batched_tokens``: the cores' batch limits."""
        self.perf = perf
        self.mark, self.batched = mark, batched
        self.kv_blocks, self.block_size = kv_blocks, block_size
        self.decode_keeps_kv = decode_keeps_kv
        self.short_first_tokens = short_first_tokens
        self.running_blocks = running_blocks
        self.max_batch, self.max_batched_tokens = max_batch, max_batched_tokens
        self.by_id: dict[str, Instance] = {}
        self._counts: dict[EngineRole, int] = {}
        for role in roles:
            self.add(role)

    def add(self, role: EngineRole | str, ready: bool = True) -> Instance:
        """A new instance of ``role`` (an engine role, or the gateway's name of one)."""
        if isinstance(role, str):
            role = next(r for r, name in _GATEWAY_ROLE.items() if name == role)
        i = self._counts.get(role, 0)
        self._counts[role] = i + 1
        iid = f"{_GATEWAY_ROLE[role]}-{i}"
        # nothing here reads a cache's KV events or filled slots (no kvmeta, no data plane)
        cache = KVCache(
            self.kv_blocks, self.block_size, running_blocks=self.running_blocks, record=False
        )
        inst = Instance(
            iid,
            _GATEWAY_ROLE[role],
            EngineCore(
                CoreConfig(
                    role=role,
                    token_ids=False,
                    decode_keeps_kv=self.decode_keeps_kv,
                    short_first_tokens=self.short_first_tokens,
                    max_batch=self.max_batch,
                    max_batched_tokens=self.max_batched_tokens,
                    output_mark=self.mark or None,
                ),
                self.perf,
                cache,
            ),
        )
        inst.ready = ready
        self.by_id[iid] = inst
        return inst

    def __iter__(self) -> Iterator[Instance]:
        """Every instance the run had, removed ones included (in creation order)."""
        return iter(self.by_id.values())

    def live(self) -> list[Instance]:
        """The instances not removed (starting, serving or draining)."""
        return [i for i in self.by_id.values() if not i.removed]

    def __len__(self) -> int:
        return len(self.by_id)

    def __getitem__(self, iid: str) -> Instance:
        return self.by_id[iid]

    def step(self, inst: Instance, now: float) -> StepResult | DecodeRun | float | None:
        """Start a step (or a decode run) on an idle instance: its result (the caller queues
        its end), the time of the next wake-up to queue (a float), or None (busy, idle, or
        wake-up queued)."""
        if inst.busy:
            return None
        if self.batched and inst.trace is None:
            run = inst.core.decode_run(now, self.mark)
            if run is not None:
                inst.busy = True
                inst.run = run
                return run
        res = inst.core.step(now)
        if res is None:
            w = inst.core.next_wakeup(now)
            if w is not None and w > now and inst.wake_at != w:
                inst.wake_at = w
                return w
            return None
        inst.busy = True
        if inst.trace is not None:
            inst.trace.step(now, res, inst.core.num_running, inst.core.num_waiting)
        return res

    def roles(self) -> dict[str, int]:
        """Serving replicas per role (worker, prefill, decode): ready, not draining."""
        out = {"worker": 0, "prefill": 0, "decode": 0}
        for inst in self.by_id.values():
            if inst.ready and not inst.retiring and not inst.removed:
                out[inst.role] += 1
        return out

    @staticmethod
    def interrupt(inst: Instance, now: float) -> DecodeRun | None:
        """A request was submitted to ``inst`` at ``now``: its decode run ends at the first
        step end from ``now`` on (the next step admits the request, as after a single step).
        The shortened run (the caller queues its end), or None when nothing changed."""
        run = inst.run
        if run is None:
            return None
        cut = inst.core.cut_run(run, now)
        if cut is run:
            return None
        inst.run = cut
        return cut

    @staticmethod
    def load(inst: Instance, full: bool, now: float) -> LoadReport:
        """What the gateway learns at ``now``: a ``/metrics`` scrape (running, waiting, KV
        usage) or, ``full``, the load stream's snapshot (also pending prefill and tokens in
        flight; a decode run's steps count once started, as single steps do)."""
        c = inst.core
        cap = c.cache.capacity_blocks * c.cache.block_size
        if full:
            left = c.tokens_in_flight()
            if inst.run is not None:
                left -= inst.run.batch * c.run_started(inst.run, now)
            return LoadReport(
                running=c.num_running,
                waiting=c.num_waiting,
                tokens_in_flight=left,
                pending_prefill_tokens=c.pending_prefill_tokens(),
                kv_usage=c.cache.usage,
                kv_capacity_tokens=cap,
            )
        return LoadReport(
            running=c.num_running, waiting=c.num_waiting, kv_usage=c.cache.usage,
            kv_capacity_tokens=cap,
        )  # fmt: skip
