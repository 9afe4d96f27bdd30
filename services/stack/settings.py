"""Settings of the local stack itself (section ``stack:`` of the YAML file)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from services.common.settings import ServiceSettings
from services.stack.engines import DEFAULT_ENGINE_BASE_PORT
from services.stack.gateways import DEFAULT_GATEWAY_PORT_STEP, MAX_GATEWAYS
from services.stack.plan import DEFAULT_REDIS_PORT


class StackSettings(ServiceSettings):
    """Common settings plus what only ``tideserve up`` uses.

    ``postgres_url`` / ``redis_url`` unset → embedded servers under ``state_dir``.
    Engine fields: simulated engines started with the stack (flags of ``up`` win).
    Gateway fields: scheduler replicas behind one HTTP address (services.stack.gateways).
    """

    redis_port: int = Field(DEFAULT_REDIS_PORT, ge=1, le=65535, description="embedded Redis port")
    secure: bool = Field(
        True,
        description="token auth on every service and per-service Redis users and Postgres "
        "roles on the embedded servers, secrets in <state_dir>/secrets (services.stack.secure)",
    )
    start_timeout_s: float = Field(
        60.0, gt=0, description="time every child gets to report SERVING"
    )
    stop_timeout_s: float = Field(10.0, gt=0, description="SIGTERM → SIGKILL grace per child")
    service_restarts: int = Field(
        5,
        ge=0,
        description="a service that dies is restarted, at most this many times a minute "
        "(then, or with 0, a dead service stops the stack)",
    )

    engines: int | None = Field(
        None,
        ge=0,
        description="aggregated simulated engines (unset: 2, or none with prefill/decode or "
        "the scheduler's own static endpoints; 0: none)",
    )
    prefill: int = Field(0, ge=0, description="prefill-only simulated engines (needs decode)")
    decode: int = Field(0, ge=0, description="decode-only simulated engines (needs prefill)")
    engine_base_port: int = Field(
        DEFAULT_ENGINE_BASE_PORT, ge=1, le=65535, description="first engine port (before offset)"
    )
    engine_ports: list[int] = Field(
        default_factory=list, description="explicit engine ports in start order (no offset)"
    )
    engine_profile: str | None = Field(None, description="perfmodel profile of the engines")
    engine_speedup: float | None = Field(None, gt=0, description="engines run this much faster")
    engine_kv_blocks: int | None = Field(None, ge=1, description="KV blocks per engine")
    engine_args: list[str] = Field(
        default_factory=list,
        description="extra arguments for every engine (`tideserve engine`'s, or the real "
        "engine's own)",
    )
    engine: Literal["sim", "vllm", "sglang"] = Field(
        "sim",
        description="the engines' kind: the simulator, or real vLLM / SGLang servers of "
        "model_path, each with its kv-bridge (aggregated engines only)",
    )
    model_path: str | None = Field(
        None, description="the model directory real engines serve (and the gateway tokenizes by)"
    )
    model_name: str | None = Field(
        None, description="the name real engines serve the model under (default: the directory's)"
    )
    engine_command: str = Field(
        "",
        description="a real engine's server command (default `vllm serve`, or `python -m "
        "sglang.launch_server`); the stack appends its flags",
    )
    engine_start_timeout_s: float = Field(
        600.0, gt=0, description="time each real engine gets to load its model and answer"
    )

    gateways: Annotated[int, Field(ge=1, le=MAX_GATEWAYS)] | Literal["auto"] = Field(
        "auto",
        description="scheduler/gateway replicas on one HTTP address (auto: one per core)",
    )
    gateway_port_step: int = Field(
        DEFAULT_GATEWAY_PORT_STEP,
        ge=1,
        description="replica k's gRPC and metrics ports: the scheduler's + k * step",
    )
    gateway_grpc_ports: list[int] = Field(
        default_factory=list,
        description="explicit gRPC ports of scheduler-2..scheduler-N in order (no offset)",
    )
