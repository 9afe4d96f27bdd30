"""The chaos suite's outcome of one attempt (tests/chaos/load.py ``classify``)."""

from __future__ import annotations

import pytest

from tests.chaos.load import classify, well_formed_error

ERR = '{"error": {"message": "no endpoint", "type": "overloaded"}}'


@pytest.mark.parametrize(
    ("status", "body", "started", "stream_error", "kind"),
    [
        (200, "", True, None, "ok"),
        (None, "", False, None, "retry"),
        (503, ERR, False, None, "retry"),
        (429, ERR, False, None, "retry"),
        (502, "<html>bad gateway</html>", False, None, "malformed"),
        (400, ERR, False, None, "final"),
        (500, "Internal Server Error", False, None, "malformed"),
        (200, "", False, "stream ended without [DONE]", "retry"),
        (200, "", True, "cut: ServerDisconnectedError", "interrupted"),
        (200, "", True, "error event: error in stream: engine gone", "final"),
    ],
    ids=[
        "completed",
        "refused-connection",
        "503-with-body",
        "429-with-body",
        "502-without-json",
        "400-with-body",
        "500-plain-text",
        "empty-stream",
        "cut-mid-stream",
        "error-event",
    ],
)
def test_classify(
    status: int | None, body: str, started: bool, stream_error: str | None, kind: str
) -> None:
    assert classify(status, body, started, stream_error) == kind


@pytest.mark.parametrize(
    ("text", "ok"),
    [(ERR, True), ('{"error": {"message": ""}}', False), ('{"error": "x"}', False), ("[]", False),
     ("not json", False)],
    ids=["openai", "empty-message", "string-error", "list", "not-json"],
)  # fmt: skip
def test_well_formed_error(text: str, ok: bool) -> None:
    assert well_formed_error(text) is ok
