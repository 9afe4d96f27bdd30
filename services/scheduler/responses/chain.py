"""Stored turns and the rebuild of a conversation from them (pure).

A stored turn holds its own canonical input items (not the history before it), its output
items and the id of the turn it continued. ``previous_response_id`` = X rebuilds the
context as every turn of X's chain, oldest first, each its inputs then its outputs; then
the new request's input follows. A link that is missing, expired or another tenant's
makes the whole chain unknown (:class:`ChainBroken`; the client is told the id it named
was not found, never whose it is), as is a cycle or a chain deeper than ``max_depth``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ChainBroken", "StoredResponse", "rebuild", "visible"]

Item = dict[str, Any]


@dataclass(frozen=True, slots=True)
class StoredResponse:
    id: str
    tenant: str
    model: str
    created_at: float
    expires_at: float
    previous_response_id: str | None
    input_items: tuple[Item, ...]
    output_items: tuple[Item, ...]
    response: dict[str, Any] = field(default_factory=dict)
    """The response object as the client got it (``GET /v1/responses/{id}``)."""


class ChainBroken(LookupError):
    """``previous_response_id`` names no usable chain; ``missing`` is the link not found."""

    def __init__(self, missing: str, why: str) -> None:
        super().__init__(why)
        self.missing, self.why = missing, why


def visible(row: StoredResponse | None, tenant: str, now: float) -> bool:
    """Whether ``tenant`` may see ``row`` at ``now`` (its own and not expired)."""
    return row is not None and row.tenant == tenant and row.expires_at > now


def rebuild(
    rows: Mapping[str, StoredResponse], start: str, tenant: str, now: float, max_depth: int
) -> list[Item]:
    """The context items of the chain ending at ``start`` (see the module doc), from
    ``rows`` (any superset of the chain, by id). Raises :class:`ChainBroken`."""
    chain: list[StoredResponse] = []
    seen: set[str] = set()
    at: str | None = start
    while at is not None:
        if at in seen:
            raise ChainBroken(start, f"the chain of {start!r} loops at {at!r}")
        if len(chain) >= max_depth:
            raise ChainBroken(start, f"the chain of {start!r} is deeper than {max_depth} turns")
        row = rows.get(at)
        if not visible(row, tenant, now):
            raise ChainBroken(at, f"response {at!r} not found")
        assert row is not None
        seen.add(at)
        chain.append(row)
        at = row.previous_response_id
    return context_items(reversed(chain))


def context_items(chain: Sequence[StoredResponse] | Any) -> list[Item]:
    """Each turn's inputs then its outputs, in the order given."""
    out: list[Item] = []
    for row in chain:
        out.extend(row.input_items)
        out.extend(row.output_items)
    return out
