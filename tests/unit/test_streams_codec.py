"""Pure parts of the streams layer: names, entry encoding, decoding failures, dead letters."""

from __future__ import annotations

from typing import Any

import pytest
from tideserve.v1 import events_pb2

from services.common.streams import (
    PayloadError,
    dead_letter,
    dead_letter_stream,
    decode_entry,
    encode_entry,
    stream_name,
)


@pytest.mark.parametrize(
    ("prefix", "kind", "deployment", "expected"),
    [
        ("ts", "kv", "llama", "ts:kv:llama"),
        ("ts", "requests", None, "ts:requests"),
        ("x", "membership", None, "x:membership"),
    ],
    ids=["per-deployment", "global", "custom-prefix"],
)
def test_stream_name(prefix: str, kind: str, deployment: str | None, expected: str) -> None:
    assert stream_name(prefix, kind, deployment) == expected


def test_stream_name_rejects_empty_parts() -> None:
    with pytest.raises(ValueError, match="non-empty"):
        stream_name("", "kv")


def test_dead_letter_stream_suffix() -> None:
    assert dead_letter_stream("ts:kv:a") == "ts:kv:a:dead"


def test_roundtrip_with_bytes_and_str_keys() -> None:
    msg = events_pb2.RequestRecord(request_id="r1", prompt_tokens=7, ttft_ms=12.5)
    fields = encode_entry(msg)
    assert fields[b"t"] == b"tideserve.v1.RequestRecord"
    assert decode_entry(fields, events_pb2.RequestRecord) == msg
    as_str: dict[Any, Any] = {k.decode(): v for k, v in fields.items()}
    assert decode_entry(as_str, events_pb2.RequestRecord) == msg


def _good() -> dict[bytes, bytes]:
    return encode_entry(events_pb2.RequestRecord(request_id="r1"))


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        (None, "no fields"),
        ({b"p": b""}, '"t" or "p"'),
        ({b"t": b"tideserve.v1.RequestRecord"}, '"t" or "p"'),
        ({**_good(), b"t": b"tideserve.v1.LoadSnapshot"}, "expected 'tideserve.v1.RequestRecord'"),
        ({b"t": b"tideserve.v1.RequestRecord", b"p": b"\xff\xff\xff\xff"}, "does not parse"),
    ],
    ids=["no-fields", "no-type", "no-payload", "wrong-type", "garbage-bytes"],
)
def test_decode_failures_raise_payload_error(fields: Any, match: str) -> None:
    with pytest.raises(PayloadError, match=match) as info:
        decode_entry(fields, events_pb2.RequestRecord)
    assert "\n" not in str(info.value)


def test_dead_letter_keeps_fields_as_bytes() -> None:
    record = dead_letter("ts:x", "1-0", "g", "bad", {b"t": b"X", "p": "str-value"}, now_ms=5)
    assert record.stream == "ts:x"
    assert record.entry_id == "1-0"
    assert record.group == "g"
    assert dict(record.fields) == {"t": b"X", "p": b"str-value"}
    assert record.ts_ms == 5
