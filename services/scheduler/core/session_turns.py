"""What the gateway tells kvmeta about an agent session's turns (pure).

A request that names a session (:mod:`services.scheduler.http.sessions`) is a turn of it.
When the turn is first picked, :func:`turn_start` is kvmeta's ``StartSessionTurn``: the
session, its tenant and parent, and the picked decode instance as its home. When the
request is done, :func:`turn_end` is ``EndSessionTurn``: the instance that served it (the
last pick), the prompt's block-hash chain and its tip (the last full block's hash and the
tokens the chain covers), the names of the tools the answer called, and whether the turn
ended the session (``X-Tideserve-Session-Final``). A turn that failed or was cancelled
still ends, never as final (the session goes idle, its chain and tools unchanged): the
agent retries or gives up, and either way nothing is running for it. A request without a
session is no turn (None).
"""

from __future__ import annotations

from dataclasses import dataclass

from tideserve.v1 import kvmeta_pb2

from services.common.routing.types import RequestView
from services.scheduler.core.records import RequestContext

__all__ = ["Tip", "tip_of", "turn_end", "turn_start"]


@dataclass(frozen=True, slots=True)
class Tip:
    """The prompt's block-hash chain (parent first), its tip (the last full block's hash)
    and the tokens up to the tip."""

    block_hash: int = 0
    tokens: int = 0
    chain: tuple[int, ...] = ()


def tip_of(view: RequestView) -> Tip:
    """The tip of ``view``'s chain (an empty tip for a prompt shorter than a block)."""
    if not view.block_hashes:
        return Tip()
    hashes = view.block_hashes
    return Tip(hashes[-1], len(hashes) * view.block_size, hashes)


def _decode_instance(ctx: RequestContext) -> str:
    return ctx.pick.decode.endpoint.instance_id if ctx.pick is not None else ""


def turn_start(ctx: RequestContext, deployment: str) -> kvmeta_pb2.StartSessionTurnRequest | None:
    """kvmeta's ``StartSessionTurn`` for the request's turn (None: no session)."""
    p = ctx.parsed
    if p is None or not p.session_id:
        return None
    return kvmeta_pb2.StartSessionTurnRequest(
        deployment=deployment,
        tenant=p.tenant,
        session_id=p.session_id,
        parent_session_id=p.parent_session_id,
        home_instance=_decode_instance(ctx),
    )


def turn_end(
    ctx: RequestContext, deployment: str, *, status: int, tip: Tip
) -> kvmeta_pb2.EndSessionTurnRequest | None:
    """kvmeta's ``EndSessionTurn`` once the request is done (module doc; None: no session)."""
    p = ctx.parsed
    if p is None or not p.session_id:
        return None
    req = kvmeta_pb2.EndSessionTurnRequest(
        deployment=deployment,
        tenant=p.tenant,
        session_id=p.session_id,
        home_instance=_decode_instance(ctx),
    )
    if status == 200 and not ctx.cancelled:
        req.final = p.session_final
        req.tip_block_hash = tip.block_hash
        req.tip_tokens = tip.tokens
        req.block_hashes.extend(tip.chain)
        names = {c.name for c in ctx.answer().tool_calls if c.name}
        req.tool_names.extend(sorted(names))
    return req
