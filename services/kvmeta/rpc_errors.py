"""How kvmeta's servicers end an RPC with an error (gRPC status and message)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, NoReturn, TypeAlias

import grpc
from sqlalchemy.exc import SQLAlchemyError

__all__ = ["Ctx", "abort", "persisted"]

Ctx: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"


async def abort(context: Ctx, code: grpc.StatusCode, msg: str) -> NoReturn:
    await context.abort(code, msg)
    raise AssertionError("unreachable")  # pragma: no cover


async def persisted(context: Ctx, persist: Callable[[], Awaitable[None]]) -> None:
    """Run a write-through ``persist``; when Postgres fails the RPC is UNAVAILABLE, and says
    that the change is applied in memory and retried in the background."""
    try:
        await persist()
    except (SQLAlchemyError, OSError) as exc:
        await abort(
            context,
            grpc.StatusCode.UNAVAILABLE,
            f"applied but not yet persisted (Postgres: {type(exc).__name__}); "
            "it is retried in the background",
        )
