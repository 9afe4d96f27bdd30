"""The engine core's value types (pure): its role, configuration, requests, per-step
outputs and the per-sequence state. :mod:`services.common.engine_core.core` re-exports the public ones;
they live here so that the core's helpers (:mod:`services.common.engine_core.prefill_plan`) can name
them without importing the core.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum

__all__ = [
    "AdmissionError",
    "CoreConfig",
    "DecodeRun",
    "EngineRole",
    "Lookup",
    "Request",
    "SeqOutput",
    "StepResult",
    "lookup_due",
]


class EngineRole(Enum):
    AGGREGATED = "aggregated"
    PREFILL = "prefill"
    DECODE = "decode"


class AdmissionError(ValueError):
    """The request can never run here (too long for the context or the cache)."""


@dataclass(frozen=True)
class CoreConfig:
    role: EngineRole = EngineRole.AGGREGATED
    max_batch: int = 256
    max_batched_tokens: int = 8192
    hold_timeout_ms: float = 30_000.0
    # False: outputs carry no token ids (``SeqOutput.tokens`` is empty; the counts are
    # kept): the discrete-event simulator, which needs how many tokens, not which.
    token_ids: bool = True
    # Decode role, SGLang-style hand-off: keep the received KV as cached prefix blocks (as
    # the prefill side does) and transfer only the prompt tokens not resident here, so an
    # agent session's next turn moves its new suffix, not its whole context. False: every
    # hand-off moves the whole prompt and the decode engine caches nothing it received.
    decode_keeps_kv: bool = False
    # > 0: prompts with at most this many tokens left to compute take each step's prefill
    # budget before longer ones (see ``_plan_short_first``); 0: FCFS (running first).
    short_first_tokens: int = 0
    # None: a step outputs every sequence it advanced (the engine's stream). A token count
    # m: only the sequences whose first token it made, that reached m generated tokens or
    # finished; the others' counts advance as usual, unreported (the discrete-event
    # simulator, which acts on a request's first token, first streamed chunk and end).
    output_mark: int | None = None


@dataclass(frozen=True)
class Request:
    rid: str
    prompt: Sequence[int]  # token ids (a tuple; the simulator passes an array("I"))
    max_new_tokens: int
    tenant: str = ""
    # Decode role with a prefill peer: modelled KV hand-off time; None = prefill here.
    kv_transfer_ms: float | None = None
    # Prefill role with a decode peer: keep the KV after finishing until ``hand_off``.
    hold_kv: bool = False
    # Decode role: cached prompt tokens the prefill peer reported (echoed in usage).
    peer_cached_tokens: int = 0
    # vLLM-style: pull the prompt's KV from a prefill peer, then recompute the last token.
    remote_prefill: bool = False
    # Modelled ms of the hand-off already spent by a real pull of the bytes (the shell pulled
    # them before submitting): the modelled transfer waits only for what is left of it.
    pulled_ms: float = 0.0
    # KV-cache tier: the shell fetched the KV of this many leading prompt tokens (they count
    # as cached, like local hits) and the modelled fetch still lasts ``fetch_wait_ms``.
    fetched_tokens: int = 0
    fetch_wait_ms: float = 0.0
    # KV-cache tier: look the tier up again at admission when blocks of the prompt resident
    # at submission were evicted while it waited (:func:`lookup_due`; the shell answers
    # :meth:`EngineCore.drain_lookups` with :meth:`EngineCore.looked_up`).
    tier_lookup: bool = False
    # The prompt's full-block hashes at this engine's block size and tenant, when the caller
    # already has them (the discrete-event simulator: the gateway computed them); None =
    # computed here.
    block_hashes: tuple[int, ...] | None = None


def lookup_due(resident_at_submit: int, resident_now: int, fetched_tokens: int, bs: int) -> bool:
    """A waiting turn asks the tier again at admission (as vLLM's KV connectors do when the
    scheduler admits a request): some of the leading blocks resident when it was submitted
    were evicted since (offload on eviction put them on the tier), and the fetch at
    submission did not cover them (pure)."""
    return resident_now < resident_at_submit and fetched_tokens < resident_at_submit * bs


@dataclass(frozen=True, slots=True)
class Lookup:
    """A tier lookup the core asks the shell for at admission: request ``rid``'s prompt
    block ``hashes``, of which ``resident`` leading ones are resident now."""

    rid: str
    hashes: tuple[int, ...]
    resident: int


@dataclass(frozen=True)
class SeqOutput:
    """Tokens a sequence produced in one step; ``finished`` is its last output."""

    rid: str
    tokens: tuple[int, ...]
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    finished: bool


@dataclass(frozen=True)
class StepResult:
    duration_ms: float
    outputs: tuple[SeqOutput, ...]
    prefill_tokens: int
    decode_tokens: int
    # Remote-prefill requests whose KV pull ended in this step (their peer may free it).
    transferred: tuple[str, ...] = ()
    decode_context: int = 0  # context tokens of the decoding sequences (attention reads)
    prefill_chunks: int = 0


@dataclass(frozen=True, slots=True)
class DecodeRun:
    """``steps`` pure decode steps of ``batch`` sequences from ``start`` (ms), the first
    with ``context`` tokens of context; ``duration_ms`` of them in all (see
    :meth:`EngineCore.decode_run`)."""

    start: float
    batch: int
    context: int
    steps: int
    duration_ms: float

    @property
    def end(self) -> float:
        return self.start + self.duration_ms


@dataclass
class _Seq:
    req: Request
    hashes: list[int]
    arrival: float
    cached: int = 0
    computed: int = 0  # prompt tokens whose KV exists
    generated: list[int] = field(default_factory=list)  # empty without token ids
    n_gen: int = 0  # tokens generated
    ready_at: float = 0.0  # decode role: KV arrival time
    resident: int = 0  # leading blocks resident at submission (``tier_lookup`` only)
    looked_up: bool = False  # the tier was asked again at admission (once per request)
    prompt_len: int = field(init=False)  # len(req.prompt), read in every step

    def __post_init__(self) -> None:
        self.prompt_len = len(self.req.prompt)
