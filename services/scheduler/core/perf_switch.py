"""The prefill model the predicted-TTFT plugins price with: the static profile, or the model
telemetry fitted from the deployment's requests once its confidence passes a setting
(pure; :mod:`services.scheduler.feeds.perf_model` refreshes it).

Rule (:meth:`PerfModelSwitch.offer`): a fit whose prefill confidence is at least
``min_confidence`` replaces the current model; one below it (or none: telemetry
unreachable or not yet fitted) leaves the static profile in place, or goes back to it
when a fitted model was in use (a confidence that fell means the fleet changed under the
fit). A fit with a negative prefill coefficient, or one that prices a token at 0, is not
a model of prefill (it goes to 0 or below for long prompts) and counts as no fit, whatever
its confidence. The fitted model prices with the ``PerfModel`` contract's formula,
``prefill_base_ms + prefill_ms_per_token * n + prefill_ms_per_token2 * n^2`` for ``n``
uncached tokens (the contract has no cached-context term, so ``cached_tokens`` is not
priced), and decode steps with its ``decode_step_ms``. Each change increments :attr:`version`, so plugins that derive figures from
the model (a throughput, a memo) recompute them.
"""

from __future__ import annotations

from typing import Literal

from services.common.perfcoef import Coefficients
from services.common.routing.registry import PrefillModel

__all__ = ["PerfModelSwitch", "plausible"]


class PerfModelSwitch:
    def __init__(self, static: PrefillModel, min_confidence: float) -> None:
        self.static = static
        self.min_confidence = min_confidence
        self.fitted: Coefficients | None = None
        self.version = 0
        # the last offer was confident but not a model of prefill (see the rule above)
        self.refused_implausible = False

    @property
    def source(self) -> Literal["profile", "fitted"]:
        return "fitted" if self.fitted is not None else "profile"

    def prefill_ms(self, uncached_tokens: int, cached_tokens: int = 0) -> float:
        f = self.fitted
        if f is None:
            return self.static.prefill_ms(uncached_tokens, cached_tokens)
        if uncached_tokens <= 0:
            return 0.0
        return max(0.0, f.prefill_ms(uncached_tokens))

    def decode_step_ms(self, batch: int, context_tokens: int) -> float:
        """One decode step of ``batch`` sequences with ``context_tokens`` of context in
        total: the fit's decode formula when a fit is in use, else the static model's (0
        when it has none)."""
        f = self.fitted
        if f is not None:
            return max(0.0, f.decode_step_ms(batch, context_tokens))
        step = getattr(self.static, "decode_step_ms", None)
        return float(step(batch, context_tokens)) if callable(step) else 0.0

    def transfer_ms(self, tokens: int) -> float:
        """The static model's KV hand-off time for ``tokens`` (a link, not fitted; 0 when it
        has none)."""
        xfer = getattr(self.static, "transfer_ms", None)
        return float(xfer(tokens)) if callable(xfer) else 0.0

    @property
    def kv_capacity_tokens(self) -> int:
        """The static model's KV capacity in tokens (0 when it has none; a fit has none)."""
        return int(getattr(self.static, "kv_capacity_tokens", 0))

    def offer(self, fitted: Coefficients | None, confidence: float) -> bool:
        """Apply the rule above; whether the model in use changed."""
        confident = fitted if confidence >= self.min_confidence else None
        self.refused_implausible = confident is not None and not plausible(confident)
        new = None if self.refused_implausible else confident
        if new == self.fitted:
            return False
        self.fitted = new
        self.version += 1
        return True


def plausible(c: Coefficients) -> bool:
    """Whether ``c`` prices prefill above 0 and never less for more tokens."""
    terms = (c.prefill_base_ms, c.prefill_ms_per_token, c.prefill_ms_per_token2)
    return all(t >= 0.0 for t in terms) and c.prefill_ms(1) > 0.0
