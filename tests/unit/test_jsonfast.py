"""orjson on hot paths parses and encodes as the standard library does."""

from __future__ import annotations

import json
from typing import Any

import pytest

from services.common import jsonfast


@pytest.mark.parametrize(
    "doc",
    [
        b'{"model": "m", "prompt": "caf\\u00e9 \xe6\x97\xa5", "max_tokens": 8}',
        b"[1, 2.5, true, null]",
        b'{"x": NaN, "y": Infinity}',
        b'{"s": "\\ud800"}',
        '{"str": "input"}',
    ],
    ids=["object", "array", "nan-infinity", "lone-surrogate", "str-input"],
)
def test_loads_gives_the_standard_librarys_value(doc: bytes | str) -> None:
    got, want = jsonfast.loads(doc), json.loads(doc)
    assert json.dumps(got) == json.dumps(want)


def test_an_integer_beyond_64_bits_parses_as_a_float() -> None:
    """The one documented difference from ``json.loads`` (orjson's rule)."""
    big = jsonfast.loads(b'{"big": 123456789012345678901234567890, "ok": 18446744073709551615}')
    assert isinstance(big["big"], float) and big["ok"] == 2**64 - 1


@pytest.mark.parametrize(
    "doc", [b"", b"{", b'{"a": 1,}', b"\xff\xfe"], ids=["empty", "truncated", "comma", "bytes"]
)
def test_invalid_json_raises_value_error(doc: bytes) -> None:
    with pytest.raises(ValueError):
        jsonfast.loads(doc)


@pytest.mark.parametrize(
    "obj",
    [
        {"model": "m", "messages": [{"role": "user", "content": "caf\u00e9"}], "stream": True},
        {"big": 2**80},
        {1: "non-string key"},
    ],
    ids=["object", "int-beyond-64-bits", "int-key"],
)
def test_dumps_is_compact_utf8_json(obj: Any) -> None:
    want = json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()
    assert jsonfast.dumps(obj) == want
