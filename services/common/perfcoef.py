"""The performance model's coefficients (the ``PerfModel`` proto's formula) and the prior
that a roofline :class:`~services.common.perfmodel.PerfProfile` gives them. Pure.

The contract (``proto/tideserve/v1/telemetry.proto``, ``PerfModel``)::

    prefill_ms(n, q)    = prefill_base_ms + prefill_ms_per_token * (n + q)
                          + prefill_ms_per_token2 * n^2
    decode_step_ms(b,c) = decode_base_ms + decode_ms_per_seq * b + decode_ms_per_ktoken * c / 1000
    transfer_ms(bytes)  = transfer_base_ms + transfer_ms_per_mb * bytes / 1e6

Prior from the roofline (compute-bound prefill, memory-bound decode, which is where each
phase runs for the prompt and batch sizes that matter). With ``F`` achieved FLOP/s, ``B``
achieved bytes/s, ``P`` parameters, ``L`` layers and ``d`` the attention width, the
profile's ``flops(n, 0) = 2Pn + 2Ld n(n+1)`` gives ``per_token = (2P + 2Ld) / F`` and
``per_token2 = 2Ld / F`` (in ms) on top of the per-step ``overhead``; a queued token costs
what a prompt token costs. Decode: ``base = overhead + weight_bytes / B``, ``per_seq =
per_seq_ms``, ``per_ktoken = 1000 * kv_bytes_per_token / B``. Transfer: ``base =
link_latency``, ``per_mb = 1e6 / link_bandwidth`` (in ms). The prior underestimates a
prefill of a few dozen tokens (which is weight-read bound, one pass over the weights) —
the fitted intercept absorbs that.
"""

from __future__ import annotations

from dataclasses import dataclass

from tideserve.v1 import telemetry_pb2

from services.common.perfmodel import PerfProfile

__all__ = ["Coefficients", "from_pb", "prior_coefficients"]


@dataclass(frozen=True)
class Coefficients:
    prefill_base_ms: float
    prefill_ms_per_token: float
    prefill_ms_per_token2: float
    decode_base_ms: float
    decode_ms_per_seq: float
    decode_ms_per_ktoken: float
    transfer_base_ms: float
    transfer_ms_per_mb: float

    def prefill_ms(self, uncached_tokens: int, queued_tokens: int = 0) -> float:
        n, q = max(0, uncached_tokens), max(0, queued_tokens)
        return (
            self.prefill_base_ms
            + self.prefill_ms_per_token * (n + q)
            + self.prefill_ms_per_token2 * n * n
        )

    def decode_step_ms(self, batch: int, context_tokens: float) -> float:
        if batch <= 0:
            return 0.0
        return (
            self.decode_base_ms
            + self.decode_ms_per_seq * batch
            + self.decode_ms_per_ktoken * max(0.0, context_tokens) / 1000.0
        )

    def transfer_ms(self, nbytes: float) -> float:
        if nbytes <= 0:
            return 0.0
        return self.transfer_base_ms + self.transfer_ms_per_mb * nbytes / 1e6


def prior_coefficients(p: PerfProfile) -> Coefficients:
    """The roofline profile ``p`` in the contract's form (see the module docstring)."""
    flops_s = p.tp * p.peak_flops * p.mfu
    bytes_s = p.tp * p.hbm_bandwidth * p.bw_eff
    ld = p.n_layers * p.n_heads * p.head_dim
    return Coefficients(
        prefill_base_ms=p.overhead_ms,
        prefill_ms_per_token=1000.0 * (2.0 * p.params + 2.0 * ld) / flops_s,
        prefill_ms_per_token2=1000.0 * 2.0 * ld / flops_s,
        decode_base_ms=p.overhead_ms + 1000.0 * p.weight_bytes / bytes_s,
        decode_ms_per_seq=p.per_seq_ms,
        decode_ms_per_ktoken=1e6 * p.kv_bytes_per_token / bytes_s,
        transfer_base_ms=p.link_latency_ms,
        transfer_ms_per_mb=1e9 / p.link_bandwidth,
    )


def from_pb(m: telemetry_pb2.PerfModel) -> Coefficients:
    """The coefficients of a ``PerfModel`` message."""
    return Coefficients(
        prefill_base_ms=m.prefill_base_ms,
        prefill_ms_per_token=m.prefill_ms_per_token,
        prefill_ms_per_token2=m.prefill_ms_per_token2,
        decode_base_ms=m.decode_base_ms,
        decode_ms_per_seq=m.decode_ms_per_seq,
        decode_ms_per_ktoken=m.decode_ms_per_ktoken,
        transfer_base_ms=m.transfer_base_ms,
        transfer_ms_per_mb=m.transfer_ms_per_mb,
    )
