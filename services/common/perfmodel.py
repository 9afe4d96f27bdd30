"""Performance model of an inference engine: a named hardware/model profile → step times.

Pure (no I/O, no clock). The engine simulator runs on it, the scheduler's predicted-TTFT
cost uses it, telemetry's fitted model starts from it as a prior and the discrete-event
simulator replays with it.

Roofline model. With ``P`` parameters, ``L`` layers, ``d = n_heads * head_dim`` (attention
width), ``F = tp * peak_flops * mfu`` (achieved FLOP/s) and ``B = tp * hbm_bandwidth * bw_eff``
(achieved bytes/s):

* FLOPs to prefill ``n`` new tokens after ``c`` cached tokens (causal attention; QK^T and
  AV are 2 matmuls of 2 FLOPs per multiply-add)::

      flops(n, c) = 2 * P * n  +  4 * L * d * n * (c + (n + 1) / 2)

  The quadratic term is why a long cached context still costs something to extend, and why
  cached tokens are cheaper than recomputed ones (their term is linear in ``n``).
* ``prefill_ms(n, c) = overhead + max(flops(n, c) / F, weight_bytes / B)`` — at least one
  pass over the weights. ``prefill_ms(0, c) == 0`` (a full cache hit computes nothing).
* ``decode_step_ms(batch, ctx) = overhead + per_seq * batch
  + max((weight_bytes + ctx * kv_bytes_per_token) / B, flops(batch, 0) / F)`` where ``ctx`` is
  the total context of the decoding sequences (every step reads all their KV).
* ``decode_steps_ms(batch, ctx, k)`` — ``k`` decode steps in a row (the context grows by
  ``batch`` a step), summed in closed form: what the discrete-event simulator advances in one
  event.
* ``step_ms(prefill_chunks, batch, ctx)`` — a mixed continuous-batching step reads the weights
  once: ``overhead + per_seq * batch + max(compute of all chunks and decode tokens / F,
  (weights + decode KV) / B)``.
* ``kv_bytes_per_token = 2 (K and V) * L * n_kv_heads * head_dim * kv_dtype_bytes``.
* ``transfer_ms(tokens) = link_latency + tokens * kv_bytes_per_token / link_bandwidth`` (KV
  hand-off from a prefill to a decode instance; ``link_bandwidth`` sums the instance's NICs).

Every profile lists its public sources next to its numbers. ``mfu``/``bw_eff``/overheads are
calibrations (stated per profile), not datasheet values.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType

__all__ = ["DEFAULT_PROFILE", "PROFILES", "PerfProfile", "get_profile"]

_GB = 1e9
_TFLOPS = 1e12


@dataclass(frozen=True)
class PerfProfile:
    """A hardware + model combination. All methods are pure and monotone in their inputs."""

    name: str
    description: str
    # Model (Hugging Face config.json).
    params: float  # parameters
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    weight_dtype_bytes: int
    kv_dtype_bytes: int
    max_context: int
    # Hardware (per GPU) and parallelism.
    tp: int  # GPUs per instance (tensor parallel)
    peak_flops: float  # dense FLOP/s per GPU at the weight dtype
    hbm_bandwidth: float  # bytes/s per GPU
    hbm_bytes: float  # bytes per GPU
    link_bandwidth: float  # bytes/s for KV hand-off, whole instance
    link_latency_ms: float
    # Calibration.
    mfu: float  # achieved fraction of peak FLOP/s in prefill
    bw_eff: float  # achieved fraction of HBM bandwidth in decode
    overhead_ms: float  # per step: launch, scheduling, collectives
    per_seq_ms: float  # per decoding sequence per step: sampling, bookkeeping

    # -- derived quantities ----------------------------------------------------------------
    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * self.kv_dtype_bytes

    @property
    def weight_bytes(self) -> float:
        return self.params * self.weight_dtype_bytes

    @property
    def kv_capacity_tokens(self) -> int:
        """Tokens of KV that fit in HBM left after the weights (90% usable, as engines reserve)."""
        free = self.tp * self.hbm_bytes * 0.9 - self.weight_bytes
        return max(0, int(free // self.kv_bytes_per_token))

    def _flops_per_s(self) -> float:
        return self.tp * self.peak_flops * self.mfu

    def _bytes_per_s(self) -> float:
        return self.tp * self.hbm_bandwidth * self.bw_eff

    def prefill_flops(self, uncached_tokens: int, cached_tokens: int = 0) -> float:
        n, c = max(0, uncached_tokens), max(0, cached_tokens)
        attn_width = self.n_heads * self.head_dim
        return 2.0 * self.params * n + 4.0 * self.n_layers * attn_width * n * (c + (n + 1) / 2)

    # -- the contract ----------------------------------------------------------------------
    def prefill_ms(self, uncached_tokens: int, cached_tokens: int = 0) -> float:
        """Time to compute ``uncached_tokens`` new tokens after ``cached_tokens`` of context."""
        if uncached_tokens <= 0:
            return 0.0
        return self.step_ms([(uncached_tokens, cached_tokens)], 0, 0)

    def decode_step_ms(self, batch: int, context_tokens: int) -> float:
        """One decode step of ``batch`` sequences whose contexts total ``context_tokens``."""
        if batch <= 0:
            return 0.0
        return self.step_ms([], batch, context_tokens)

    def decode_steps_ms(self, batch: int, context_tokens: int, steps: int) -> float:
        """``steps`` consecutive decode steps of ``batch`` sequences, the first with
        ``context_tokens`` of context, each adding one token per sequence: the sum of their
        ``decode_step_ms`` in closed form (equal up to float rounding). Each step is
        compute-bound while its KV reads take less time than its FLOPs, memory-bound after."""
        if batch <= 0 or steps <= 0:
            return 0.0
        compute = 2.0 * self.params * batch / self._flops_per_s()
        bps = self._bytes_per_s()
        mem0 = (self.weight_bytes + max(0, context_tokens) * self.kv_bytes_per_token) / bps
        slope = batch * self.kv_bytes_per_token / bps  # the KV a step adds, read by the next
        if slope > 0:
            bound = min(steps, max(0, math.ceil((compute - mem0) / slope)))
        else:
            bound = steps if mem0 < compute else 0
        rest = steps - bound
        busy = (
            bound * compute + rest * mem0 + slope * (steps * (steps - 1) - bound * (bound - 1)) / 2
        )
        return steps * (self.overhead_ms + self.per_seq_ms * batch) + busy * 1000.0

    def step_ms(
        self, prefill_chunks: Sequence[tuple[int, int]], decode_batch: int, decode_context: int
    ) -> float:
        """One continuous-batching step: prefill chunks ``(new_tokens, cached_before)`` plus
        ``decode_batch`` decoding sequences with ``decode_context`` total context tokens.
        Returns 0.0 for an empty step."""
        chunks = [(n, c) for n, c in prefill_chunks if n > 0]
        batch = max(0, decode_batch)
        if not chunks and batch == 0:
            return 0.0
        flops = sum(self.prefill_flops(n, c) for n, c in chunks)
        flops += 2.0 * self.params * batch
        mem = self.weight_bytes + max(0, decode_context) * self.kv_bytes_per_token
        busy_s = max(flops / self._flops_per_s(), mem / self._bytes_per_s())
        return self.overhead_ms + self.per_seq_ms * batch + busy_s * 1000.0

    def transfer_ms(self, tokens: int) -> float:
        """Modelled time to hand off ``tokens`` of KV between instances (0 for no tokens)."""
        if tokens <= 0:
            return 0.0
        return self.link_latency_ms + tokens * self.kv_bytes_per_token / self.link_bandwidth * 1e3

    def slowed(self, factor: float) -> PerfProfile:
        """This hardware ``factor`` times slower (``factor < 1``: faster): every step and
        transfer time above is multiplied by ``factor`` (achieved FLOP/s, bytes/s and link
        bandwidth divided by it, overheads and link latency multiplied), capacities
        unchanged. Named ``{name}*{factor}``."""
        if factor <= 0:
            raise ValueError("slow-down factor must be > 0")
        return replace(
            self,
            name=f"{self.name}*{factor:g}",
            description=f"{self.description}, {factor:g}x slower",
            mfu=self.mfu / factor,
            bw_eff=self.bw_eff / factor,
            overhead_ms=self.overhead_ms * factor,
            per_seq_ms=self.per_seq_ms * factor,
            link_bandwidth=self.link_bandwidth / factor,
            link_latency_ms=self.link_latency_ms * factor,
        )

    def prefill_tokens_per_s(self, chunk: int = 4096) -> float:
        """Prefill throughput on uncached ``chunk``-token prompts (for planners/priors)."""
        return chunk / self.prefill_ms(chunk) * 1000.0


# --- Public sources ----------------------------------------------------------------------
# [H200]  NVIDIA H200 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h200/):
#         141 GB HBM3e, 4.8 TB/s; BF16 dense 989 TFLOPS (the datasheet's 1,979 is with sparsity).
# [HGX]   NVIDIA HGX H200 / DGX H200: 8 GPUs, 8x ConnectX-7 400 Gb/s (50 GB/s) compute NICs.
# [L8B]   meta-llama/Llama-3.1-8B config.json (huggingface.co): 32 layers, 32 heads,
#         8 KV heads, head_dim 128, hidden 4096, max_position_embeddings 131072; 8.03 B params.
# [L70B]  meta-llama/Llama-3.1-70B config.json: 80 layers, 64 heads, 8 KV heads, head_dim 128,
#         hidden 8192, 131072 context; 70.6 B params.
# [CAL]   Calibration (our assumption, not a measurement): prefill at 45% MFU (TP1) / 35% (TP8)
#         and decode at 75% / 60% of HBM bandwidth, within the ranges commonly reported for
#         SGLang/vLLM on Hopper. Resulting figures (checked in tests/unit/test_perfmodel.py):
#         8B/H200 ≈ 26k prefill tok/s on 4k-token prompts, ≈ 4.9 ms per decode step at batch 1
#         (≈ 200 tok/s single stream); 70B/8xH200 ≈ 19k prefill tok/s, ≈ 7.7 ms per step.
_H200_FLOPS = 989 * _TFLOPS
_H200_BW = 4.8e12
_H200_HBM = 141 * _GB
_CX7 = 50 * _GB  # 400 Gb/s

PROFILES: Mapping[str, PerfProfile] = MappingProxyType(
    {
        p.name: p
        for p in (
            PerfProfile(
                name="h200-llama3.1-8b",
                description="Llama-3.1-8B, BF16, one H200 (TP1) [H200][L8B][CAL]",
                params=8.03e9,
                n_layers=32,
                n_heads=32,
                n_kv_heads=8,
                head_dim=128,
                weight_dtype_bytes=2,
                kv_dtype_bytes=2,
                max_context=131_072,
                tp=1,
                peak_flops=_H200_FLOPS,
                hbm_bandwidth=_H200_BW,
                hbm_bytes=_H200_HBM,
                link_bandwidth=_CX7,
                link_latency_ms=0.5,
                mfu=0.45,
                bw_eff=0.75,
                overhead_ms=0.4,
                per_seq_ms=0.01,
            ),
            PerfProfile(
                name="h200x8-llama3.1-70b",
                description="Llama-3.1-70B, BF16, eight H200 (TP8) [H200][HGX][L70B][CAL]",
                params=70.6e9,
                n_layers=80,
                n_heads=64,
                n_kv_heads=8,
                head_dim=128,
                weight_dtype_bytes=2,
                kv_dtype_bytes=2,
                max_context=131_072,
                tp=8,
                peak_flops=_H200_FLOPS,
                hbm_bandwidth=_H200_BW,
                hbm_bytes=_H200_HBM,
                link_bandwidth=8 * _CX7,
                link_latency_ms=0.5,
                mfu=0.35,  # TP8 all-reduces cost more than TP1
                bw_eff=0.6,
                overhead_ms=1.5,
                per_seq_ms=0.01,
            ),
            PerfProfile(
                # Not real hardware: a small, slow-enough model for fast, readable tests
                # (≈ 1 ms per decode step, ≈ 0.05 ms per prefilled token, 4 KiB KV per token).
                name="test",
                description="synthetic profile for tests (not a real device)",
                params=1e8,
                n_layers=4,
                n_heads=4,
                n_kv_heads=2,
                head_dim=128,
                weight_dtype_bytes=2,
                kv_dtype_bytes=2,
                max_context=32_768,
                tp=1,
                peak_flops=4 * _TFLOPS,
                hbm_bandwidth=250 * _GB,
                hbm_bytes=4 * _GB,
                link_bandwidth=1 * _GB,
                link_latency_ms=0.2,
                mfu=1.0,
                bw_eff=1.0,
                overhead_ms=0.2,
                per_seq_ms=0.01,
            ),
        )
    }
)

DEFAULT_PROFILE = "h200-llama3.1-8b"


def get_profile(name: str) -> PerfProfile:
    """The profile called ``name``, or ``NAME*FACTOR`` for that profile
    :meth:`~PerfProfile.slowed` by ``FACTOR`` (e.g. ``h200-llama3.1-8b*2``: the same device
    twice as slow, to run engines slower than a gateway believes); ``KeyError`` naming the
    known profiles otherwise."""
    base, star, factor = name.partition("*")
    try:
        profile = PROFILES[base]
        return profile.slowed(float(factor)) if star else profile
    except (KeyError, ValueError):
        known = ", ".join(sorted(PROFILES))
        raise KeyError(
            f"unknown performance profile {name!r}; known: {known} (each as NAME*FACTOR "
            "for a slower or faster device)"
        ) from None
