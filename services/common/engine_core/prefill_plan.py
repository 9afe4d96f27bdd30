"""How an engine step spends its prefill budget (a mixin of
:class:`services.common.engine_core.core.EngineCore`; pure, time passed in).

FCFS (the default): the prompts being prefilled take the budget in arrival order, then the
waiting queue's head is admitted while budget is left. Short first
(``CoreConfig.short_first_tokens`` > 0): prompts with at most that many tokens left to
compute go before longer ones, so a session's next turn (a few thousand new tokens over a
cached prefix) does not wait behind another session's 100k-token first prompt.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from services.common.engine_core.core_types import CoreConfig, _Seq
    from services.common.engine_core.kvcache import KVCache

__all__ = ["PrefillPlanner"]


class PrefillPlanner:
    """The prefill planning of an engine core (its attributes are the core's)."""

    config: CoreConfig
    cache: KVCache
    _waiting: deque[_Seq]
    _running: dict[str, _Seq]
    _transferring: dict[str, _Seq]

    if TYPE_CHECKING:

        def _admit(self, s: _Seq, now: float) -> bool: ...

        def _parked(self, rid: str) -> bool: ...

    def _plan_chunks(self, budget: int, now: float) -> list[tuple[_Seq, int]]:
        if self.config.short_first_tokens > 0:
            return self._plan_short_first(budget, now)
        return self._plan_fcfs(budget, now)

    def _plan_fcfs(self, budget: int, now: float) -> list[tuple[_Seq, int]]:
        """Prefill chunks within ``budget``: running prompts first (FCFS), then admissions
        from the waiting queue's head while budget is left."""
        chunks: list[tuple[_Seq, int]] = []
        for s in self._running.values():
            if budget <= 0:
                break
            if s.computed < s.prompt_len:
                n = min(budget, s.prompt_len - s.computed)
                chunks.append((s, n))
                budget -= n
        self._admit_head(budget, now, chunks)
        return chunks

    def _admit_head(self, budget: int, now: float, chunks: list[tuple[_Seq, int]]) -> int:
        """Admit from the waiting queue's head while ``budget`` is left, each with its first
        chunk. The budget left."""
        while budget > 0 and self._waiting and len(self._running) < self.config.max_batch:
            if not self._admit(self._waiting[0], now):
                break
            s = self._waiting.popleft()
            if self._parked(s.req.rid):
                continue
            n = min(budget, s.prompt_len - s.computed)
            chunks.append((s, n))
            budget -= n
        return budget

    def _admit_short(
        self, budget: int, now: float, chunks: list[tuple[_Seq, int]], limit: int
    ) -> int:
        """Admit the waiting prompts with at most ``limit`` uncached tokens (as the cache
        stands), in queue order, passing longer ones, while ``budget`` is left and they fit
        the cache; each with its first chunk. The budget left."""
        bs = self.cache.block_size
        kept: deque[_Seq] = deque()
        while self._waiting:
            s = self._waiting.popleft()
            if (
                budget <= 0
                or len(self._running) >= self.config.max_batch
                or s.prompt_len - self.cache.match(s.hashes) * bs > limit
                or not self._admit(s, now)
            ):
                kept.append(s)
                continue
            if self._parked(s.req.rid):
                continue
            n = min(budget, s.prompt_len - s.computed)
            chunks.append((s, n))
            budget -= n
        self._waiting = kept
        return budget

    def _plan_short_first(self, budget: int, now: float) -> list[tuple[_Seq, int]]:
        """Prefill chunks within ``budget`` with short prompts first: running prompts with
        at most ``short_first_tokens`` left, then waiting prompts whose uncached part is that
        short, then the longer running prompts (FCFS), then admissions as FCFS
        would. A turn that adds a few thousand tokens to a session cached here then does not
        wait behind another session's 100k-token first prompt; the long prompt gets what the
        short ones leave. Short waiting prompts pass long ones in the queue. A turn whose prefix
        is not cached yet (its predecessor still prefills) counts as long, so it is not
        admitted early to compute that prefix again."""
        limit = self.config.short_first_tokens
        chunks: list[tuple[_Seq, int]] = []
        long: list[_Seq] = []
        for s in self._running.values():
            left = s.prompt_len - s.computed
            if left <= 0:
                continue
            if left > limit:
                long.append(s)
            elif budget > 0:
                chunks.append((s, min(budget, left)))
                budget -= chunks[-1][1]
        budget = self._admit_short(budget, now, chunks, limit)
        for s in long:
            if budget <= 0:
                break
            n = min(budget, s.prompt_len - s.computed)
            chunks.append((s, n))
            budget -= n
        self._admit_head(budget, now, chunks)
        return chunks
