"""The simulation's inputs as one validated value (pure).

:class:`SimConfig` holds everything a run depends on besides the trace; ``validate`` raises
:class:`SimConfigError` with a one-line message for a value the simulator cannot run with.
The same config and trace always give the same results (the seed drives every random
choice: the routing plugins' RNG and the spreading of requests over gateways).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from services.common.admission.shaper_config import (
    DISPATCH_FOLLOW_MS,
    DISPATCH_HOLD_MS,
    DISPATCH_ORDER,
)
from services.common.perfmodel import DEFAULT_PROFILE, get_profile
from services.sim.autoscale import AutoscaleConfig

__all__ = ["SimConfig", "SimConfigError", "tier_blocks"]

MIB = 1 << 20


def tier_blocks(mib: int, engine_profile: str, block_size: int) -> int:
    """How many ``block_size``-token KV blocks of ``engine_profile``'s model ``mib`` MiB
    hold (a tier's size, as ``--kvcache-mib`` gives it, in the simulator's blocks)."""
    return mib * MIB // (get_profile(engine_profile).kv_bytes_per_token * block_size)


LoadSource = Literal["scrape", "stream"]


class SimConfigError(ValueError):
    """A configuration the simulator refuses; the message is one line."""


@dataclass(frozen=True, slots=True)
class SimConfig:
    """One simulated run. Times in ms of modelled time unless named otherwise.

    Fleet: ``engines`` aggregated workers, or ``prefill`` + ``decode`` instances (P/D, the
    SGLang-style hand-off). Arrivals: trace time / (``rate_scale`` x ``speedup``), as
    ``tideserve bench`` sends them; the engines run at modelled speed.
    """

    engines: int = 8
    prefill: int = 0
    decode: int = 0
    profile: str = "default"
    profiles_file: str | None = None
    engine_profile: str = DEFAULT_PROFILE
    # the perf profile the gateways price with; "" = the engines' (an exact model)
    gateway_perf_profile: str = ""
    gateways: int = 1
    # gateway replicas share routed prefixes and in-flight load, as ``tideserve up`` runs
    # them (``share_state``): another replica's pick reaches this one ``share_lag_ms``
    # later, its in-flight counts every ``share_heartbeat_ms`` (live: 0.1 s, expiring after
    # 3 s); off, each replica knows only its own picks
    share_state: bool = True
    share_lag_ms: float = 5.0
    share_heartbeat_ms: float = 100.0
    seed: int = 0
    rate_scale: float = 1.0
    speedup: float = 1.0
    max_requests: int | None = None
    offset: int = 0
    kv_blocks: int = 16384
    # KV blocks running requests may hold per engine (None: kv_blocks): a cache bigger than
    # the batch (a reference that differs from another run only in what stays cached)
    kv_running_blocks: int | None = None
    block_size: int = 64
    # engines' batch limits (``CoreConfig``, the engine's --max-batch and
    # --max-batched-tokens): running sequences, and tokens per step / prefill chunk
    max_batch: int = 256
    max_batched_tokens: int = 8192
    stream_interval: int = 16
    load_source: LoadSource = "scrape"
    # scraped load: the gateways also price the waiting requests they did not send
    scrape_queue_estimate: bool = False
    precise: bool = False
    scrape_interval_ms: float = 500.0
    scrape_lag_ms: float = 5.0
    # the gateways learn that a request ended this long after the engine's last step (the
    # last chunk's way back through the HTTP stack; 0: at once)
    end_lag_ms: float = 0.0
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None
    decode_can_prefill: bool = False
    # P/D: decode engines cache the KV they receive and take only the part they lack
    # (``services.common.engine_core.core.CoreConfig.decode_keeps_kv``)
    decode_keeps_kv: bool = False
    # engines: prompts with at most this many tokens left to compute are prefilled first
    # (``CoreConfig.short_first_tokens``); 0 = FCFS
    short_first_tokens: int = 0
    shaper_hold_ms: float = DISPATCH_HOLD_MS
    # finished requests' records keep their block hashes (for analyses of a run's
    # prefixes; off, a long run's records stay small)
    keep_block_hashes: bool = False
    shaper_age_weight: float = 1.0
    shaper_order: str = DISPATCH_ORDER
    # the dispatch order holds a request whose prefix an unanswered one still computes on
    # its instance until that one's first byte, at most this long (ms); 0 = off
    shaper_follow_ms: float = DISPATCH_FOLLOW_MS
    # protection (admission.protect): a request that cannot meet its TTFT deadline waits
    # while its instance serves one that still can, at most this long (ms; the SLO class's
    # starve_after_ms in the gateway); 0 = off
    shaper_protect_ms: float = 0.0
    shaper_protect_slack: bool = False  # ShaperConfig.protect_slack
    shaper_protect_when_missed: float = 0.0  # ShaperConfig.protect_when_missed
    timeline_s: float = 60.0
    autoscale: AutoscaleConfig | None = None  # None: a fixed fleet
    # agent memory (services/sim/memory.py): None = off; "lru", "retention" or "prefetch"
    agent_memory: str | None = None
    memory_budget_share: float = 0.2
    memory_tier_blocks: int = 1 << 22
    # the tier's size in MiB (as a kvcache role's --kvcache-mib, DRAM plus disk), which
    # replaces memory_tier_blocks when set: blocks of the engine profile's KV bytes
    memory_tier_mib: int | None = None
    # idle sessions past the budget: "pressure" (kept on the GPU while it has room) or
    # "eager" (offloaded at once; the rule before)
    memory_offload: str = "pressure"
    # hot-spot rebalancing (services/common/sessions/rebalance.py) in the offload modes:
    # each round, idle sessions leave an instance holding most of the active sessions' KV
    memory_rebalance: bool = False
    # an explicit scale-in (services/sim/scalein.py): at this modelled second the
    # autoscaler's victim rule picks ``scale_in_count`` engines, drained then removed
    scale_in_at_s: float | None = None
    scale_in_count: int = 1
    # the "active session" window of the scale-in measurement (modelled seconds)
    scale_in_window_s: float = 300.0
    # an instance failure (services/sim/failures.py): at this modelled second ``fail_count``
    # serving engines (seeded choice) die; the gateways' membership drops them
    # ``fail_detect_s`` later; a request not yet streaming is retried elsewhere up to
    # ``retries`` times after ``retry_backoff_ms x 2^attempt`` (the gateway's own defaults)
    fail_at_s: float | None = None
    fail_count: int = 1
    fail_role: str | None = None  # "prefill" or "decode" (P/D); None: any serving engine
    fail_detect_s: float = 5.0
    retries: int = 2
    retry_backoff_ms: float = 20.0

    @property
    def pd(self) -> bool:
        return self.prefill > 0 or self.decode > 0

    @property
    def instances(self) -> int:
        return self.prefill + self.decode if self.pd else self.engines

    @property
    def time_divisor(self) -> float:
        return self.rate_scale * self.speedup

    @property
    def tier_blocks(self) -> int:
        """The agent-memory tier's size in blocks (``memory_tier_mib`` when set)."""
        if self.memory_tier_mib is None:
            return self.memory_tier_blocks
        return tier_blocks(self.memory_tier_mib, self.engine_profile, self.block_size)

    def validate(self) -> SimConfig:
        """``self`` when runnable; raises ``SimConfigError`` otherwise."""
        if self.pd:
            if self.prefill < 1 or self.decode < 1:
                raise SimConfigError("P/D needs --prefill N and --decode M, both at least 1")
        elif self.engines < 1:
            raise SimConfigError(f"--engines must be at least 1, got {self.engines}")
        for name in (
            "gateways", "kv_blocks", "block_size", "stream_interval", "max_batch",
            "max_batched_tokens",
        ):  # fmt: skip
            if getattr(self, name) < 1:
                flag = name.replace("_", "-")
                raise SimConfigError(f"--{flag} must be at least 1, got {getattr(self, name)}")
        for name in ("rate_scale", "speedup", "scrape_interval_ms", "timeline_s"):
            if not getattr(self, name) > 0:
                flag = name.replace("_", "-")
                raise SimConfigError(f"--{flag} must be > 0, got {getattr(self, name)}")
        if self.kv_running_blocks is not None and not 1 <= self.kv_running_blocks <= self.kv_blocks:
            raise SimConfigError("--kv-running-blocks must be in [1, kv_blocks]")
        if self.max_requests is not None and self.max_requests < 1:
            raise SimConfigError(f"--max-requests must be at least 1, got {self.max_requests}")
        if min(self.seed, self.offset, self.scrape_lag_ms, self.share_lag_ms, self.end_lag_ms) < 0:
            raise SimConfigError(
                "--seed, --offset, --scrape-lag-ms, --share-lag-ms and --end-lag-ms must be >= 0"
            )
        if not self.share_heartbeat_ms > 0:
            raise SimConfigError(f"--share-heartbeat-ms must be > 0, got {self.share_heartbeat_ms}")
        for name in ("slo_ttft_ms", "slo_tpot_ms"):
            v = getattr(self, name)
            if v is not None and not v > 0:
                raise SimConfigError(f"--{name.replace('_', '-')} must be > 0, got {v}")
        if self.agent_memory not in (None, "lru", "retention", "prefetch"):
            raise SimConfigError(
                f"--agent-memory must be lru, retention or prefetch, got {self.agent_memory}"
            )
        if not 0.0 <= self.memory_budget_share <= 1.0 or self.memory_tier_blocks < 0:
            raise SimConfigError("--memory-budget-share in [0, 1], --memory-tier-blocks >= 0")
        if self.memory_tier_mib is not None and self.memory_tier_mib < 0:
            raise SimConfigError(f"--memory-tier-mib must be >= 0, got {self.memory_tier_mib}")
        if self.memory_offload not in ("pressure", "eager"):
            raise SimConfigError(f"--memory-offload: pressure or eager, got {self.memory_offload}")
        if self.scale_in_at_s is not None:
            if self.pd:
                raise SimConfigError("--scale-in-at-s needs aggregated engines (not P/D)")
            if self.scale_in_at_s < 0 or not 1 <= self.scale_in_count < self.engines:
                raise SimConfigError(
                    "--scale-in-at-s must be >= 0 and --scale-in-count in [1, engines)"
                )
            if not self.scale_in_window_s > 0:
                raise SimConfigError("--scale-in-window-s must be > 0")
        if self.fail_at_s is not None:
            pool = self.instances
            if self.fail_role is not None:
                if not self.pd or self.fail_role not in ("prefill", "decode"):
                    raise SimConfigError("--fail-role must be prefill or decode, with P/D engines")
                pool = self.prefill if self.fail_role == "prefill" else self.decode
            if self.fail_at_s < 0 or not 1 <= self.fail_count < pool:
                raise SimConfigError(
                    "--fail-at-s must be >= 0 and --fail-count in [1, engines of the role)"
                )
            if self.fail_detect_s < 0 or self.retries < 0 or self.retry_backoff_ms < 0:
                raise SimConfigError("--fail-detect-s, retries and their backoff must be >= 0")
        a = self.autoscale
        if a is not None:
            if not 1 <= a.min_replicas <= a.max_replicas:
                raise SimConfigError(f"--max-replicas must be at least 1, got {a.max_replicas}")
            if not (a.tick_s > 0 and a.window_s > 0 and a.startup_s >= 0):
                raise SimConfigError("autoscaling needs tick_s, window_s > 0 and startup_s >= 0")
            if not a.load_speedup > 0:
                raise SimConfigError(f"the load's speedup must be > 0, got {a.load_speedup}")
            try:
                a.planner_config()
            except ValueError as exc:
                first = str(exc).splitlines()
                raise SimConfigError(f"planner settings: {' '.join(first[:3])}") from None
        try:
            get_profile(self.engine_profile)
            get_profile(self.gateway_perf_profile or self.engine_profile)
        except KeyError as exc:
            raise SimConfigError(str(exc.args[0])) from None
        return self
