"""Info and admin endpoints of the engine simulator (:class:`services.engine.server.EngineServer`).

The routes read the engine through :class:`EngineView` (a protocol the server satisfies), so
this module does not import the server: ``server`` imports ``info_routes``, never the reverse.

Info (read-only, SGLang/vLLM shapes): ``/health`` and ``/health_generate``, ``/server_info``
(``/get_server_info``), ``/model_info`` (``/get_model_info``), ``/v1/models``, ``/metrics``.

Admin/test: ``POST /fault`` sets fault knobs (``fail_rate`` clamped to [0, 1],
``die_after_tokens``, ``refuse_health``, ``stall_s`` from now) and ``GET``/``POST /fault``
answer the current knobs; a body that is not a JSON object of such numbers is a 400.
``POST /flush_cache`` empties the KV cache, or answers 400 ``busy`` while requests run.

Also :func:`write_model_dir` (the local "model" directory routers read) and :func:`bad_request`
(the OpenAI-style 400 every engine endpoint uses).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from aiohttp import web

from services.common.engine_core.core import EngineCore, EngineRole
from services.common.perfmodel import PerfProfile
from services.engine import api
from services.engine.events import LoadFigures
from services.engine.metrics import CONTENT_TYPE_LATEST, EngineMetrics, Gauges
from services.engine.settings import EngineSettings

__all__ = ["EngineView", "Faults", "InfoRoutes", "bad_request", "write_model_dir"]


@dataclass
class Faults:
    """Injected faults; ``stall_until`` is in ``time.monotonic()`` seconds."""

    fail_rate: float = 0.0
    die_after_tokens: int = 0
    refuse_health: bool = False
    stall_until: float = 0.0  # monotonic seconds


def write_model_dir(state_dir: Path, model: str, max_context: int) -> Path:
    """``<state_dir>/model`` with a minimal config.json, so routers that read ``model_path``
    find a local directory and do not try to download a tokenizer. Idempotent."""
    path = state_dir / "model"
    path.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "_name_or_path": model,
        "max_position_embeddings": max_context,
        "vocab_size": 128_000,
        "tideserve_simulator": True,
    }
    (path / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return path


def bad_request(message: str, param: str | None = None, code: str | None = None) -> web.Response:
    """HTTP 400 with an OpenAI-style ``invalid_request_error`` body."""
    return web.json_response(
        api.error_body(message, "invalid_request_error", param, code), status=400
    )


class EngineView(Protocol):
    """What the info and admin routes read of an engine (``EngineServer`` provides it)."""

    settings: EngineSettings
    profile: PerfProfile
    role: EngineRole
    core: EngineCore
    metrics: EngineMetrics
    faults: Faults
    model_dir: Path
    instance_id: str
    epoch: int

    def figures(self) -> LoadFigures: ...


class InfoRoutes:
    """Handlers of the info and admin endpoints of one engine; they read the engine's
    current state at request time (e.g. its instance id once the port is bound)."""

    def __init__(self, engine: EngineView) -> None:
        self._e = engine

    def add_to(self, r: web.UrlDispatcher) -> None:
        """Register the info endpoints (admin endpoints: ``add_admin_to``)."""
        r.add_get("/health", self.health)
        r.add_get("/health_generate", self.health)
        for path in ("/server_info", "/get_server_info"):
            r.add_get(path, self.server_info)
        for path in ("/model_info", "/get_model_info"):
            r.add_get(path, self.model_info)
        r.add_get("/v1/models", self.models)
        r.add_get("/metrics", self.metrics)

    def add_admin_to(self, r: web.UrlDispatcher) -> None:
        r.add_post("/fault", self.fault)
        r.add_get("/fault", self.fault)
        r.add_post("/flush_cache", self.flush_cache)

    # -- info ----------------------------------------------------------------------------
    async def health(self, _req: web.Request) -> web.Response:
        if self._e.faults.refuse_health:
            return web.Response(status=503, text="unhealthy (fault injected)")
        return web.Response(text="")

    def _mode(self) -> str:
        role = self._e.role
        return "null" if role is EngineRole.AGGREGATED else role.value

    async def server_info(self, _req: web.Request) -> web.Response:
        e = self._e
        s, f = e.settings, e.figures()
        return web.json_response(
            {
                "model_path": str(e.model_dir),
                "tokenizer_path": str(e.model_dir),
                "served_model_name": s.model,
                "version": "tideserve-sim",
                "engine": "tideserve-sim",
                "instance_id": e.instance_id,
                "profile": e.profile.name,
                "disaggregation_mode": self._mode(),
                "disaggregation_bootstrap_port": s.bootstrap_port or None,
                "page_size": s.block_size,
                "max_total_num_tokens": e.core.cache.capacity_blocks * s.block_size,
                "max_running_requests": s.max_batch,
                "chunked_prefill_size": s.max_batched_tokens,
                "context_length": e.profile.max_context,
                "stream_interval": s.stream_interval,
                "speedup": s.speedup,
                "tp_size": e.profile.tp,
                "dp_size": 1,
                "internal_states": [
                    {"num_running_reqs": f.num_running, "num_queue_reqs": f.num_waiting}
                ],
            }
        )

    async def model_info(self, _req: web.Request) -> web.Response:
        e = self._e
        return web.json_response(
            {
                "model_path": str(e.model_dir),
                "tokenizer_path": str(e.model_dir),
                "served_model_name": e.settings.model,
                "is_generation": True,
                "max_context_length": e.profile.max_context,
            }
        )

    async def models(self, _req: web.Request) -> web.Response:
        e = self._e
        return web.json_response(
            {
                "object": "list",
                "data": [
                    {
                        "id": e.settings.model,
                        "object": "model",
                        "created": e.epoch // 1000,
                        "owned_by": "tideserve",
                        "root": str(e.model_dir),
                        "max_model_len": e.profile.max_context,
                    }
                ],
            }
        )

    async def metrics(self, _req: web.Request) -> web.Response:
        e = self._e
        f = e.figures()
        g = Gauges(
            num_running=f.num_running,
            num_waiting=f.num_waiting,
            used_tokens=e.core.cache.referenced_blocks * e.settings.block_size,
            kv_usage=f.kv_usage,
            cache_hit_rate=f.cache_hit_rate,
            gen_throughput=f.decode_tps,
        )
        resp = web.Response(body=e.metrics.render(g))
        resp.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return resp

    # -- admin ---------------------------------------------------------------------------
    async def fault(self, req: web.Request) -> web.Response:
        faults = self._e.faults
        if req.method == "POST":
            try:
                body = await req.json()
                if not isinstance(body, dict):
                    raise ValueError("body must be an object")
                if "fail_rate" in body:
                    faults.fail_rate = min(1.0, max(0.0, float(body["fail_rate"])))
                if "die_after_tokens" in body:
                    faults.die_after_tokens = max(0, int(body["die_after_tokens"]))
                if "refuse_health" in body:
                    faults.refuse_health = bool(body["refuse_health"])
                if "stall_s" in body:
                    faults.stall_until = time.monotonic() + max(0.0, float(body["stall_s"]))
            except (ValueError, TypeError) as err:
                return bad_request(str(err))
        return web.json_response(
            {
                "fail_rate": faults.fail_rate,
                "die_after_tokens": faults.die_after_tokens,
                "refuse_health": faults.refuse_health,
                "stalled_for_s": max(0.0, faults.stall_until - time.monotonic()),
            }
        )

    async def flush_cache(self, _req: web.Request) -> web.Response:
        if not self._e.core.cache.clear():
            return bad_request("cannot flush the cache while requests are running", code="busy")
        return web.Response(text="Cache flushed.\n")
