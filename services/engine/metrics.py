"""Prometheus metrics of a simulated engine, under SGLang's or vLLM's own metric names.

One ``CollectorRegistry`` per engine (several engines may live in one test process). Gauges
are refreshed from a :class:`Gauges` snapshot just before each scrape. Latency histograms are
in **modelled** seconds (what the simulated GPU would take), not wall-clock seconds scaled by
``--speedup``.

SGLang dialect: ``sglang:num_running_reqs``, ``sglang:num_queue_reqs``,
``sglang:num_used_tokens``, ``sglang:token_usage``, ``sglang:cache_hit_rate``,
``sglang:gen_throughput``, ``sglang:prompt_tokens_total``, ``sglang:generation_tokens_total``,
``sglang:cached_tokens_total``, ``sglang:num_requests_total``,
``sglang:time_to_first_token_seconds``, ``sglang:inter_token_latency_seconds``,
``sglang:e2e_request_latency_seconds``, ``sglang:max_total_num_tokens`` (the KV capacity).

Both dialects, the data plane (``--kv-data-plane``; no engine has these names):
``tideserve:kv_pull_bytes_total``, ``tideserve:kv_pulls_total{outcome="ok"|"recomputed"}``,
``tideserve:kv_pull_seconds`` (wall time of verified pulls).

vLLM dialect: ``vllm:num_requests_running``, ``vllm:num_requests_waiting``,
``vllm:gpu_cache_usage_perc``, ``vllm:kv_cache_usage_perc``, ``vllm:prefix_cache_queries_total``,
``vllm:prefix_cache_hits_total``, ``vllm:prompt_tokens_total``, ``vllm:generation_tokens_total``,
``vllm:request_success_total``, ``vllm:time_to_first_token_seconds``,
``vllm:inter_token_latency_seconds``, ``vllm:e2e_request_latency_seconds``,
``vllm:cache_config_info`` (value 1; labels ``block_size``, ``num_gpu_blocks``: the KV capacity).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

__all__ = ["CONTENT_TYPE_LATEST", "EngineMetrics", "Gauges"]

_TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0)
_ITL_BUCKETS = (0.002, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0)
_PULL_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)
_E2E_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0)


@dataclass(frozen=True)
class Gauges:
    num_running: int
    num_waiting: int
    used_tokens: int
    kv_usage: float
    cache_hit_rate: float
    gen_throughput: float


class EngineMetrics:
    def __init__(
        self,
        dialect: Literal["sglang", "vllm"],
        model_name: str,
        kv_blocks: int = 0,
        block_size: int = 0,
    ) -> None:
        """``kv_blocks`` x ``block_size``: the KV capacity the engine reports (0: none)."""
        self.dialect = dialect
        self.registry = CollectorRegistry()
        r, labels = self.registry, ["model_name"]
        p = "sglang:" if dialect == "sglang" else "vllm:"
        self._model = model_name

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(p + name, doc, labels, registry=r)

        def counter(name: str, doc: str) -> Counter:
            return Counter(p + name, doc, labels, registry=r)

        def hist(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(p + name, doc, labels, registry=r, buckets=buckets)

        if dialect == "sglang":
            self._running = gauge("num_running_reqs", "Running requests")
            self._waiting = gauge("num_queue_reqs", "Queued requests")
            self._used = gauge("num_used_tokens", "KV tokens in use")
            self._usage = gauge("token_usage", "KV cache usage [0, 1]")
            self._hit = gauge("cache_hit_rate", "Prefix cache hit rate [0, 1]")
            self._tput = gauge("gen_throughput", "Generation throughput (tokens/s, modelled)")
            self._usage2: Gauge | None = None
            self._prompt = counter("prompt_tokens", "Prompt tokens")
            self._gen = counter("generation_tokens", "Generated tokens")
            self._cached = counter("cached_tokens", "Prompt tokens served from the prefix cache")
            self._queries: Counter | None = None
            self._done = counter("num_requests", "Finished requests")
            self._ttft = hist("time_to_first_token_seconds", "TTFT (modelled)", _TTFT_BUCKETS)
            self._itl = hist("inter_token_latency_seconds", "Inter-token latency", _ITL_BUCKETS)
            self._e2e = hist("e2e_request_latency_seconds", "End-to-end latency", _E2E_BUCKETS)
        else:
            self._running = gauge("num_requests_running", "Running requests")
            self._waiting = gauge("num_requests_waiting", "Waiting requests")
            self._used = gauge("num_used_tokens", "KV tokens in use")
            self._usage = gauge("gpu_cache_usage_perc", "KV cache usage [0, 1]")
            self._usage2 = gauge("kv_cache_usage_perc", "KV cache usage [0, 1]")
            self._hit = gauge("prefix_cache_hit_rate", "Prefix cache hit rate [0, 1]")
            self._tput = gauge("generation_throughput", "Generation throughput (tokens/s)")
            self._prompt = counter("prompt_tokens", "Prompt tokens")
            self._gen = counter("generation_tokens", "Generated tokens")
            self._cached = counter("prefix_cache_hits", "Prefix cache hits, in tokens")
            self._queries = counter("prefix_cache_queries", "Prefix cache queries, in tokens")
            self._done = counter("request_success", "Finished requests")
            self._ttft = hist("time_to_first_token_seconds", "TTFT (modelled)", _TTFT_BUCKETS)
            self._itl = hist("inter_token_latency_seconds", "Inter-token latency", _ITL_BUCKETS)
            self._e2e = hist("e2e_request_latency_seconds", "End-to-end latency", _E2E_BUCKETS)

        self._pull_bytes = Counter(
            "tideserve:kv_pull_bytes", "KV bytes pulled from peers", labels, registry=r
        )
        self._pulls = Counter(
            "tideserve:kv_pulls", "KV pulls by outcome", [*labels, "outcome"], registry=r
        )
        self._pull_s = Histogram(
            "tideserve:kv_pull_seconds",
            "Wall time of verified KV pulls",
            labels,
            registry=r,
            buckets=_PULL_BUCKETS,
        )
        self._pull_bytes.labels(model_name)
        self._pull_s.labels(model_name)
        for outcome in ("ok", "recomputed"):
            self._pulls.labels(model_name, outcome)

        if kv_blocks and block_size:
            self._capacity(dialect, kv_blocks, block_size)

        # Every series exists from the first scrape (zero), as in the real engines.
        for metric in (
            self._prompt, self._gen, self._cached, self._queries, self._done,
            self._ttft, self._itl, self._e2e,
        ):  # fmt: skip
            if metric is not None:
                metric.labels(model_name)

    def _capacity(self, dialect: str, kv_blocks: int, block_size: int) -> None:
        r = self.registry
        if dialect == "sglang":
            g = Gauge("sglang:max_total_num_tokens", "KV capacity in tokens", ["model_name"],
                      registry=r)  # fmt: skip
            g.labels(self._model).set(kv_blocks * block_size)
            return
        names = ["model_name", "block_size", "num_gpu_blocks"]
        info = Gauge("vllm:cache_config_info", "KV cache configuration", names, registry=r)
        info.labels(self._model, str(block_size), str(kv_blocks)).set(1)

    # -- events from the shell -------------------------------------------------------------
    def on_admitted(self, prompt_tokens: int, cached_tokens: int) -> None:
        self._prompt.labels(self._model).inc(prompt_tokens)
        self._cached.labels(self._model).inc(cached_tokens)
        if self._queries is not None:
            self._queries.labels(self._model).inc(prompt_tokens)

    def on_tokens(self, n: int) -> None:
        self._gen.labels(self._model).inc(n)

    def on_first_token(self, ttft_s: float) -> None:
        self._ttft.labels(self._model).observe(ttft_s)

    def on_inter_token(self, itl_s: float) -> None:
        self._itl.labels(self._model).observe(itl_s)

    def on_finished(self, e2e_s: float) -> None:
        self._done.labels(self._model).inc()
        self._e2e.labels(self._model).observe(e2e_s)

    def on_kv_pull(self, ok: bool, nbytes: int, ms: float) -> None:
        """A P/D pull ended: verified (``ok``) or failed (the request recomputes)."""
        self._pulls.labels(self._model, "ok" if ok else "recomputed").inc()
        if ok:
            self._pull_bytes.labels(self._model).inc(nbytes)
            self._pull_s.labels(self._model).observe(ms / 1000.0)

    def render(self, g: Gauges) -> bytes:
        m = self._model
        self._running.labels(m).set(g.num_running)
        self._waiting.labels(m).set(g.num_waiting)
        self._used.labels(m).set(g.used_tokens)
        self._usage.labels(m).set(g.kv_usage)
        if self._usage2 is not None:
            self._usage2.labels(m).set(g.kv_usage)
        self._hit.labels(m).set(g.cache_hit_rate)
        self._tput.labels(m).set(g.gen_throughput)
        return generate_latest(self.registry)
