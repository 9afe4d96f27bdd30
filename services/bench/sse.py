"""Incremental reader of an OpenAI streaming response (pure: times are passed in).

Feed it the SSE lines of ``/v1/chat/completions`` or ``/v1/completions`` with
``stream: true`` and ``stream_options.include_usage``; ``finish`` returns the measured
timings or the reason the stream failed.

* A token event is a chunk whose ``choices[0].delta.content`` (chat) or ``choices[0].text``
  (completions) is non-empty. The first one sets TTFT, the last one ends decoding.
* Token count: ``usage.completion_tokens`` when the server reports it (a chunk may carry
  several tokens when the server coalesces), else the number of token events.
* TPOT = (last token event - first token event) / (tokens - 1), None below 2 tokens.
* Failures: an ``{"error": ...}`` payload, a line that is not JSON, no ``data: [DONE]``
  before the end, or ``[DONE]`` without any token.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


class StreamError(Exception):
    """The stream is broken; the message is the failure reason."""


@dataclass(frozen=True, slots=True)
class StreamOutcome:
    error: str | None
    ttft_s: float | None
    tpot_s: float | None
    e2e_s: float
    output_tokens: int
    prompt_tokens: int | None
    cached_tokens: int | None


def _int_or_none(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


class StreamState:
    """Accumulates one response stream; ``sent_at`` and every ``now`` share one clock."""

    def __init__(self, sent_at: float) -> None:
        self.sent_at = sent_at
        self.first_token_at: float | None = None
        self.last_token_at: float | None = None
        self.token_events = 0
        self.done = False
        self.completion_tokens: int | None = None
        self.prompt_tokens: int | None = None
        self.cached_tokens: int | None = None

    def feed_line(self, line: str, now: float) -> None:
        """Consume one line (without the newline). Raises StreamError on a broken stream."""
        line = line.strip()
        if not line.startswith("data:"):
            return  # blank separators, comments (":"), "event:" and "id:" lines
        payload = line[5:].strip()
        if payload == "[DONE]":
            self.done = True
            return
        if self.done:
            return
        try:
            obj = json.loads(payload)
        except json.JSONDecodeError:
            raise StreamError(f"malformed SSE data: {payload[:80]!r}") from None
        if not isinstance(obj, dict):
            raise StreamError(f"malformed SSE data: {payload[:80]!r}")
        if obj.get("error"):
            err = obj["error"]
            msg = err.get("message") if isinstance(err, dict) else str(err)
            raise StreamError(f"error in stream: {msg}")
        if _chunk_text(obj):
            if self.first_token_at is None:
                self.first_token_at = now
            self.last_token_at = now
            self.token_events += 1
        usage = obj.get("usage")
        if isinstance(usage, dict):
            self.completion_tokens = _int_or_none(usage.get("completion_tokens"))
            self.prompt_tokens = _int_or_none(usage.get("prompt_tokens"))
            details = usage.get("prompt_tokens_details")
            cached = details.get("cached_tokens") if isinstance(details, dict) else None
            self.cached_tokens = _int_or_none(cached)
            if self.cached_tokens is None and self.prompt_tokens is not None:
                self.cached_tokens = 0

    def finish(self, now: float, error: str | None = None) -> StreamOutcome:
        """The outcome at end of stream (``error`` overrides: e.g. a transport failure)."""
        tokens = self.completion_tokens if self.completion_tokens is not None else self.token_events
        if error is None and not self.done:
            error = "stream ended without [DONE]"
        if error is None and self.first_token_at is None:
            error = "stream finished without any token"
        ttft = None if self.first_token_at is None else self.first_token_at - self.sent_at
        tpot = None
        if self.first_token_at is not None and self.last_token_at is not None and tokens >= 2:
            tpot = (self.last_token_at - self.first_token_at) / (tokens - 1)
        return StreamOutcome(
            error=error,
            ttft_s=ttft,
            tpot_s=tpot,
            e2e_s=now - self.sent_at,
            output_tokens=tokens,
            prompt_tokens=self.prompt_tokens,
            cached_tokens=self.cached_tokens,
        )


def _chunk_text(obj: dict[str, Any]) -> str:
    choices = obj.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return ""
    choice = choices[0]
    delta = choice.get("delta")
    if isinstance(delta, dict):
        content = delta.get("content")
        return content if isinstance(content, str) else ""
    text = choice.get("text")
    return text if isinstance(text, str) else ""
