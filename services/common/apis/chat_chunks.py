"""What the request record needs of a chat stream that a translator already parsed.

A translator parses every chunk of the engine's chat stream; it hands :class:`ChunkFacts`
each chunk that is not a plain one (one choice, no tool calls, no ``usage``, ``type`` or
``error``), which keeps the last chunk with a ``usage`` object and the chunks that may
carry a tool call (the gateway's tool-call reader, :mod:`services.scheduler.core.tools`,
reads them), so the record does not parse the stream's bytes a second time.

:func:`plain_text` reads the usual chunk of a streamed answer (one choice, a delta with
only text, no finish) without parsing it: the translators' per-token path.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["ChunkFacts", "not_plain", "plain_text"]

_NAME = rb'"[ !#-\[\]-~]*"'  # a printable ASCII string without escapes
_PLAIN_TEXT = re.compile(
    rb'\{"id": ?' + _NAME + rb', ?"object": ?"chat\.completion\.chunk", ?'
    rb'"created": ?(?:0|[1-9][0-9]*), ?"model": ?' + _NAME + rb", ?"
    rb'(?:"system_fingerprint": ?(?:null|' + _NAME + rb"), ?)?"
    rb'"choices": ?\[\{"index": ?0, ?"delta": ?\{"content": ?"([^"\\\x00-\x1f]+)"\}, ?'
    rb'"logprobs": ?null, ?"finish_reason": ?null(?:, ?"stop_reason": ?null)?\}\]\}'
)
"""The chunk engines write per token (vLLM's, SGLang's and the simulator's keys, compact or
with a space after the separators), its text without escapes: group 1."""


def plain_text(payload: bytes) -> tuple[bytes, str] | None:
    """The text of a chunk (a ``data:`` line's payload) of the usual shape (see
    ``_PLAIN_TEXT``): the text as the JSON encoder writes it (the bytes between the quotes
    need no escape) and the text; None for any other chunk, which must be parsed. For a
    chunk it gives a value for, parsing gives a plain chunk (:func:`not_plain` False) of one
    choice whose delta holds only this text and whose ``finish_reason`` is null."""
    m = _PLAIN_TEXT.fullmatch(payload)
    if m is None:
        return None
    raw = m.group(1)
    try:
        text = raw.decode()
    except UnicodeDecodeError:  # not UTF-8: as the parser takes it (or refuses it)
        return None
    return b'"' + raw + b'"', text


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
