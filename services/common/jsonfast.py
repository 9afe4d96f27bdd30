"""JSON on hot paths: orjson, with the standard library's semantics kept.

:func:`loads` parses with orjson (about 10x faster than ``json.loads`` on the gateway's
request and answer bodies) and falls back to ``json.loads`` for what orjson refuses and the
standard library accepts (``NaN``/``Infinity``, lone surrogate escapes), so a document
parses to the same value either way, with one exception: an integer beyond 64 bits becomes
a float (orjson's rule; no field the gateway reads is anywhere near that). Invalid JSON
raises the standard library's ``json.JSONDecodeError`` (a ``ValueError``) with its usual
message.
:func:`dumps` gives compact UTF-8 bytes (``ensure_ascii=False``: the same document as
``json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()`` for JSON types;
a float NaN or infinity becomes ``null``, as JSON has no such number). A lone surrogate
(which ``loads`` gives for an escape such as ``"\\ud800"``, and which UTF-8 cannot encode) is
written as that escape, as ``json.dumps`` writes it: the document read back is the same.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

__all__ = ["dumps", "loads"]


def loads(data: bytes | str) -> Any:
    """The value of one JSON document (see the module doc). Raises ``ValueError``."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)


def dumps(obj: Any) -> bytes:
    """Compact UTF-8 JSON of ``obj``; falls back to ``json.dumps`` for values orjson does
    not encode (integers beyond 64 bits, non-string keys)."""
    try:
        return orjson.dumps(obj)
    except TypeError:
        text = json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
        # a lone surrogate is only ever inside a string, where its escape is what it means
        return text.encode("utf-8", "backslashreplace")
