"""OpenAI chat messages: validation, content parts, and the simulator's chat template (pure).

The one rule for ``messages`` (the gateway and the engine simulator both parse with it):

- a non-empty list of objects, each with a string ``role``;
- ``content`` is ``null`` (empty), a string, or a list of content parts;
- content parts must all be ``{"type": "text", "text": <string>}``. Any other part (image,
  audio, file, ...) is REJECTED with :class:`ChatError` (HTTP 400): Tideserve serves text
  only, and skipping a part would make the prompt, its token count and its block hashes
  differ silently from what a multimodal engine computes.

How parts reach the prompt depends on the template (see ``model.py``): the simulator's template
and string-format model templates see the texts joined by the engine kind's separator (vLLM
``"\\n"``, SGLang and the simulator ``" "``, as those engines flatten them); templates that
iterate over ``message['content']`` get the text parts themselves.

The simulator's template (:func:`chat_prompt`): one ``"<role>: <content>"`` line per message,
joined by ``"\\n"``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["ChatError", "ChatMessage", "chat_messages", "chat_prompt", "flatten"]

ChatMessage = dict[str, Any]
"""A validated message: ``role`` (str), ``content`` (str or a list of text parts), and the
message's other non-null fields unchanged."""


class ChatError(ValueError):
    """Bad ``messages``; ``param`` and ``code`` as in an OpenAI error body."""

    def __init__(self, message: str, param: str = "messages", code: str = "invalid_type") -> None:
        super().__init__(message)
        self.message, self.param, self.code = message, param, code


def chat_messages(messages: Any) -> list[ChatMessage]:
    """Validate ``messages`` (see the module doc). Raises :class:`ChatError`."""
    if not isinstance(messages, list) or not messages:
        raise ChatError("'messages' must be a non-empty list")
    out: list[ChatMessage] = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str):
            raise ChatError(f"messages[{i}] must be an object with a 'role'")
        content = m.get("content")
        msg: ChatMessage = {k: v for k, v in m.items() if v is not None}
        if content is None:
            msg["content"] = ""
        elif isinstance(content, list):
            for j, p in enumerate(content):
                kind = p.get("type") if isinstance(p, Mapping) else None
                if kind != "text":
                    raise ChatError(
                        f"messages[{i}].content[{j}] has type {kind!r}: only 'text' content "
                        "parts are supported",
                        code="unsupported_content",
                    )
                if not isinstance(p.get("text"), str):
                    raise ChatError(f"messages[{i}].content[{j}].text must be a string")
            msg["content"] = [{"type": "text", "text": p["text"]} for p in content]
        elif not isinstance(content, str):
            raise ChatError(f"messages[{i}].content must be a string or a list")
        out.append(msg)
    return out


def flatten(content: str | list[dict[str, Any]], sep: str = " ") -> str:
    """A validated message's content as one string: text parts joined by ``sep``."""
    if isinstance(content, str):
        return content
    return sep.join(str(p["text"]) for p in content)


def chat_prompt(messages: Any) -> str:
    """The simulator's chat template over raw ``messages``: ``"role: content"`` lines (text
    parts joined by a space). Raises :class:`ChatError`."""
    return "\n".join(f"{m['role']}: {flatten(m['content'])}" for m in chat_messages(messages))
