"""What the request record needs of a chat stream that a translator already parsed.

A translator parses every chunk of the engine's chat stream; it keeps the last chunk with a
``usage`` object and the chunks whose ``data:`` line names a tool call (the lines the
gateway's tool-call reader parses, :mod:`services.scheduler.core.tools`), so the record
reads those instead of parsing the stream's bytes a second time.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["TOOL_MARKS", "ChunkFacts"]

TOOL_MARKS = re.compile(rb'"tool_calls"|"tool_use"|"input_json_delta"')
"""The names on a line that may carry a tool call (the tool-call reader's marks)."""


class ChunkFacts:
    """The chunks a translator keeps for the record (see the module doc)."""

    __slots__ = ("tool_chunks", "usage_chunk")

    def __init__(self) -> None:
        self.usage_chunk: dict[str, Any] | None = None
        self.tool_chunks: list[Any] = []

    def parsed(self, raw: bytes, obj: dict[str, Any]) -> None:
        """A parsed chunk (``raw``: its line as read); cheap for most, which carry
        neither a tool call nor usage."""
        if (b'"tool_' in raw or b'"input_json_delta"' in raw) and (
            raw.startswith(b"data:") and TOOL_MARKS.search(raw) is not None
        ):
            self.tool_chunks.append(obj)
        if isinstance(obj.get("usage"), dict):
            self.usage_chunk = obj
