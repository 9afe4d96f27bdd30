"""What the request record needs of a chat stream that a translator already parsed.

A translator parses every chunk of the engine's chat stream; it hands :class:`ChunkFacts`
each chunk that is not a plain one (one choice, no tool calls, no ``usage``, ``type`` or
``error``), which keeps the last chunk with a ``usage`` object and the chunks that may
carry a tool call (the gateway's tool-call reader, :mod:`services.scheduler.core.tools`,
reads them), so the record does not parse the stream's bytes a second time.

:class:`TextChunks` reads the usual chunk of a streamed answer (the next token's text)
without parsing it: the translators' per-token path.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

__all__ = ["ChunkFacts", "TextChunks", "not_plain"]

_SIMPLE = re.compile(rb'[^"\\\x00-\x1f]+')
"""A JSON string's bytes between its quotes that hold no escape (the bytes the JSON encoder
writes for their text), and nothing a string cannot hold unescaped."""

_PROBE = b"\x7f"


class TextChunks:
    """The usual chunk of one chat stream read without parsing it.

    Engines write every token's chunk alike: the same bytes (id, model, created, the choice's
    keys) around the text. From a chunk that was parsed and found usual (a plain chunk, see
    :func:`not_plain`, of one choice whose delta holds only its text and whose
    ``finish_reason`` is null) :meth:`learn` keeps the bytes before and after its text;
    :meth:`text` gives the text of a chunk that is those bytes around another text without
    escapes. Such a chunk parses as the learnt one with that text in its place (JSON reads a
    string to its first unescaped quote, and the bytes around it are the same tokens); the
    split is checked when it is learnt, by parsing the chunk with a probe text in its place."""

    __slots__ = ("_head", "_hits", "_learnt", "_tail")

    def __init__(self) -> None:
        self._head = b""  # b"": nothing learnt
        self._tail = b""
        self._hits = 0
        self._learnt = 0

    def text(self, payload: bytes) -> tuple[bytes, str] | None:
        """The text of a usual chunk (a ``data:`` line's payload) as the JSON encoder writes
        it, and the text; None for any other chunk, which must be parsed."""
        head, tail = self._head, self._tail
        if not head or not payload.startswith(head) or not payload.endswith(tail):
            return None
        raw = payload[len(head) : len(payload) - len(tail)]
        if _SIMPLE.fullmatch(raw) is None:
            return None
        try:
            text = raw.decode()
        except UnicodeDecodeError:  # not UTF-8: as the parser takes it (or refuses it)
            return None
        self._hits += 1
        return b'"' + raw + b'"', text

    def learn(self, payload: bytes, obj: dict[str, Any], text: str) -> None:
        """``obj``: ``payload`` parsed, a usual chunk (see the class doc) of ``text``. Now and
        then: the chunks of an engine whose chunks differ in more than their text are parsed."""
        if self._learnt > 2 + self._hits // 8:
            return
        self._learnt += 1
        try:
            inner = orjson.dumps(text)[1:-1]
        except TypeError:  # a lone surrogate
            return
        if _SIMPLE.fullmatch(inner) is None or inner == _PROBE:  # the probe must differ
            return
        at = payload.rfind(b'"' + inner + b'"')
        if at < 0:
            return
        head, tail = payload[: at + 1], payload[at + 1 + len(inner) :]
        try:  # the probe in the text's place parses as obj with the probe for its text
            probe = orjson.loads(head + _PROBE + tail)
            delta = probe["choices"][0]["delta"]
        except (orjson.JSONDecodeError, LookupError, TypeError):
            return
        if isinstance(delta, dict) and delta.get("content") == "\x7f":
            delta["content"] = text
            if probe == obj:
                self._head, self._tail = head, tail


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
