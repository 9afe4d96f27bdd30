"""What the request record needs of a chat stream that a translator already parsed.

A translator parses every chunk of the engine's chat stream; it hands :class:`ChunkFacts`
each chunk that is not a plain one (one choice, no tool calls, no ``usage``, ``type`` or
``error``), which keeps the last chunk with a ``usage`` object and the chunks that may
carry a tool call (the gateway's tool-call reader, :mod:`services.scheduler.core.tools`,
reads them), so the record does not parse the stream's bytes a second time.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ChunkFacts", "not_plain"]


def not_plain(obj: dict[str, Any], choices: Any) -> bool:
    """``obj`` (with ``choices``, its ``"choices"``) is not a plain chunk: it has a
    ``usage``, ``type`` or ``error``, or more than one choice (the record may need it)."""
    return (
        "usage" in obj
        or "type" in obj
        or "error" in obj
        or (isinstance(choices, list) and len(choices) > 1)
    )


def _may_call(obj: dict[str, Any]) -> bool:
    """A chunk the tool-call reader may take a call from: an Anthropic-shaped event, or a
    choice whose delta names tool calls."""
    if "type" in obj:
        return True
    choices = obj.get("choices")
    if not isinstance(choices, list):
        return False
    for c in choices:
        delta = c.get("delta") if isinstance(c, dict) else None
        if isinstance(delta, dict) and "tool_calls" in delta:
            return True
    return False


class ChunkFacts:
    """The chunks a translator keeps for the record (see the module doc)."""

    __slots__ = ("tool_chunks", "usage_chunk")

    def __init__(self) -> None:
        self.usage_chunk: dict[str, Any] | None = None
        self.tool_chunks: list[Any] = []

    def kept(self, obj: dict[str, Any]) -> None:
        """A chunk that is not plain (see the module doc), or whose one delta names tool
        calls; each chunk at most once."""
        if isinstance(obj.get("usage"), dict):
            self.usage_chunk = obj
        if _may_call(obj):
            self.tool_chunks.append(obj)
