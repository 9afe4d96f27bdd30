"""One builder of the routing :class:`RequestView` for tests (by token ids or by hashes)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from services.common.routing.types import RequestView
from services.common.tokens import block_hashes


def request_view(
    rid: str = "r",
    *,
    tokens: Sequence[int] | None = None,
    hashes: Sequence[int] = (),
    block_size: int,
    prompt_tokens: int | None = None,
    **kw: Any,
) -> RequestView:
    """A view of ``tokens`` (hashed with the simulator's block hashes) or of ``hashes``;
    ``prompt_tokens`` defaults to the tokens given, else one full block per hash."""
    if tokens is not None:
        hashes = block_hashes(list(tokens), block_size)
        n = len(tokens)
    else:
        n = len(hashes) * block_size
    return RequestView(
        request_id=rid,
        prompt_tokens=n if prompt_tokens is None else prompt_tokens,
        block_hashes=tuple(hashes),
        block_size=block_size,
        **kw,
    )
