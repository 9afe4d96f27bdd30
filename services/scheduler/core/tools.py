"""Agent tool calls of one turn (pure): what an OpenAI chat request offered and carried back,
and what the model answered with. Names and sizes always; contents only with ``keep``
(the gateway's ``record_tool_contents``).

- :func:`tools_offered`: the number of entries in the request's ``tools``.
- :func:`tool_results_of`: the ``tool`` messages after the last ``assistant`` message (the
  results of the tool calls it made); each result's tool name is resolved from that
  assistant message's ``tool_calls`` by ``tool_call_id`` ("" when it is not there).
- :func:`tool_calls_of`: the ``tool_calls`` of a whole answer's ``choices[].message`` (or
  the ``tool_use`` blocks of a whole Anthropic message, as an engine serving the Messages
  API natively answers).
- :class:`StreamToolCalls`: the same from an SSE stream: the ``delta.tool_calls`` fragments,
  accumulated by (choice, tool) index; id and name come in the first fragment, the
  arguments in pieces (an Anthropic Messages stream's ``tool_use`` blocks and their
  ``input_json_delta`` pieces too). Fed raw chunks (events may straddle chunks); a chunk whose
  complete lines do not mention ``tool_calls`` costs one byte search.

Sizes are UTF-8 bytes of the argument string / of the message's text content.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "StreamToolCalls",
    "ToolCallFact",
    "ToolResultFact",
    "tool_calls_of",
    "tool_results_of",
    "tools_offered",
]

_MARK = b'"tool_calls"'
# An Anthropic stream's tool call: its block start ("tool_use") and input pieces.
_MARKS = (_MARK, b'"tool_use"', b'"input_json_delta"')
_MAX_CARRY = 1 << 20  # an unterminated line longer than this is dropped


@dataclass(frozen=True, slots=True)
class ToolCallFact:
    """A tool call the model made (``arguments`` only when contents are kept)."""

    id: str
    name: str
    argument_bytes: int
    arguments: str = ""


@dataclass(frozen=True, slots=True)
class ToolResultFact:
    """A tool result the client sent back (``content`` only when contents are kept)."""

    tool_call_id: str
    name: str
    content_bytes: int
    content: str = ""


def _utf8_len(s: str) -> int:
    """``s``'s size in UTF-8; a lone surrogate (an escape such as ``"\\ud800"`` in the JSON)
    counts as the three bytes of its code point."""
    return len(s.encode("utf-8", "surrogatepass"))


def _str(v: Any) -> str:
    return v if isinstance(v, str) else ""


def tools_offered(body: dict[str, Any]) -> int:
    tools = body.get("tools")
    return len(tools) if isinstance(tools, list) else 0


def _text(content: Any) -> str:
    """A message's text: the string, or its text parts joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            _str(p.get("text")) for p in content if isinstance(p, dict) and p.get("type") == "text"
        )
    return ""


def tool_results_of(messages: Any, keep: bool = False) -> tuple[ToolResultFact, ...]:
    """The tool results of this turn (see the module docstring); () for anything else."""
    if not isinstance(messages, list):
        return ()
    trailing: list[dict[str, Any]] = []
    caller: dict[str, Any] | None = None
    for m in reversed(messages):
        if not isinstance(m, dict):
            continue
        role = m.get("role")
        if role == "assistant":
            caller = m
            break
        if role == "tool":
            trailing.append(m)
    if not trailing:
        return ()
    names: dict[str, str] = {}
    calls = caller.get("tool_calls") if caller is not None else None
    if isinstance(calls, list):
        for c in calls:
            if isinstance(c, dict) and isinstance(c.get("function"), dict):
                names[_str(c.get("id"))] = _str(c["function"].get("name"))
    out = []
    for m in reversed(trailing):
        call_id = _str(m.get("tool_call_id"))
        text = _text(m.get("content"))
        out.append(
            ToolResultFact(
                tool_call_id=call_id,
                name=names.get(call_id, "") or _str(m.get("name")),
                content_bytes=_utf8_len(text),
                content=text if keep else "",
            )
        )
    return tuple(out)


def _call(c: Any, keep: bool) -> ToolCallFact | None:
    if not isinstance(c, dict):
        return None
    fn = c.get("function")
    fn = fn if isinstance(fn, dict) else {}
    args = _str(fn.get("arguments"))
    return ToolCallFact(
        _str(c.get("id")), _str(fn.get("name")), _utf8_len(args), args if keep else ""
    )


def _tool_uses(answer: dict[str, Any], keep: bool) -> tuple[ToolCallFact, ...]:
    """The ``tool_use`` blocks of an Anthropic message (arguments: ``input`` as JSON)."""
    out = []
    for b in answer["content"]:
        if isinstance(b, dict) and b.get("type") == "tool_use":
            args = json.dumps(b.get("input", {}))
            out.append(
                ToolCallFact(
                    _str(b.get("id")), _str(b.get("name")), _utf8_len(args), args if keep else ""
                )
            )
    return tuple(out)


def tool_calls_of(answer: Any, keep: bool = False) -> tuple[ToolCallFact, ...]:
    """The tool calls of a whole chat answer (every choice, in order), or of an Anthropic
    message (its ``tool_use`` blocks)."""
    if isinstance(answer, dict) and answer.get("type") == "message":
        return _tool_uses(answer, keep) if isinstance(answer.get("content"), list) else ()
    if not isinstance(answer, dict) or not isinstance(answer.get("choices"), list):
        return ()
    out: list[ToolCallFact] = []
    for choice in answer["choices"]:
        msg = choice.get("message") if isinstance(choice, dict) else None
        calls = msg.get("tool_calls") if isinstance(msg, dict) else None
        if isinstance(calls, list):
            out.extend(x for x in (_call(c, keep) for c in calls) if x is not None)
    return tuple(out)


@dataclass(slots=True)
class _Partial:
    id: str = ""
    name: str = ""
    argument_bytes: int = 0
    pieces: list[str] = field(default_factory=list)


@dataclass(slots=True)
class StreamToolCalls:
    """Accumulates a chat stream's tool calls; :meth:`calls` gives them at any point."""

    keep: bool = False
    _carry: bytes = b""
    _calls: dict[tuple[int, int], _Partial] = field(default_factory=dict)

    def feed(self, data: bytes) -> None:
        if self._carry:
            data = self._carry + data
        end = data.rfind(b"\n")
        if end < 0:
            self._carry = data if len(data) <= _MAX_CARRY else b""
            return
        rest = data[end + 1 :]
        self._carry = rest if len(rest) <= _MAX_CARRY else b""
        head = data[:end]
        if not any(m in head for m in _MARKS):
            return
        for line in head.split(b"\n"):
            if line.startswith(b"data:") and any(m in line for m in _MARKS):
                try:
                    self.event(json.loads(line[5:]))
                except (ValueError, UnicodeDecodeError):
                    continue

    def event(self, evt: Any) -> None:
        """One event, already parsed (what :meth:`feed` does with each line it reads)."""
        if isinstance(evt, dict) and evt.get("type") in (
            "content_block_start",
            "content_block_delta",
        ):
            self._anthropic(evt)
            return
        choices = evt.get("choices") if isinstance(evt, dict) else None
        for ci, choice in enumerate(choices if isinstance(choices, list) else ()):
            delta = choice.get("delta") if isinstance(choice, dict) else None
            frags = delta.get("tool_calls") if isinstance(delta, dict) else None
            if not isinstance(frags, list):
                continue
            cidx = choice.get("index", ci)
            for ti, frag in enumerate(frags):
                if not isinstance(frag, dict):
                    continue
                tidx = frag.get("index", ti)
                key = (cidx if isinstance(cidx, int) else ci, tidx if isinstance(tidx, int) else ti)
                part = self._calls.setdefault(key, _Partial())
                part.id = part.id or _str(frag.get("id"))
                fn = frag.get("function")
                if isinstance(fn, dict):
                    part.name = part.name or _str(fn.get("name"))
                    args = _str(fn.get("arguments"))
                    part.argument_bytes += _utf8_len(args)
                    if self.keep and args:
                        part.pieces.append(args)

    def _anthropic(self, evt: dict[str, Any]) -> None:
        """An Anthropic stream's ``tool_use`` block start or ``input_json_delta``."""
        idx = evt.get("index")
        key = (0, idx if isinstance(idx, int) else 0)
        block, delta = evt.get("content_block"), evt.get("delta")
        if isinstance(block, dict) and block.get("type") == "tool_use":
            part = self._calls.setdefault(key, _Partial())
            part.id, part.name = _str(block.get("id")), _str(block.get("name"))
        elif (
            isinstance(delta, dict)
            and delta.get("type") == "input_json_delta"
            and key in self._calls
        ):
            args = _str(delta.get("partial_json"))
            self._calls[key].argument_bytes += _utf8_len(args)
            if self.keep and args:
                self._calls[key].pieces.append(args)

    def calls(self) -> tuple[ToolCallFact, ...]:
        return tuple(
            ToolCallFact(p.id, p.name, p.argument_bytes, "".join(p.pieces))
            for _, p in sorted(self._calls.items())
        )
