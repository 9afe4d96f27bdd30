"""The Responses API on a `tideserve up` stack (real processes, simulated engines), driven by
the real ``openai`` SDK: the scheduler's settings wire the Postgres store (the schema is
migrated at start), a multi-turn loop continued by ``previous_response_id`` alone stays on
one engine and hits its prefix cache, and the request records say ``api: responses``."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from tests.helpers.engine_stack import (
    REQUEST_TIMEOUT_S,
    EngineStack,
    request_records,
    start_engine_stack,
    words,
)

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def stack(postgres_url: str, redis_url: str) -> Iterator[EngineStack]:
    with start_engine_stack(
        postgres_url, redis_url, 2, ["--engines", "2", "--engine-speedup", "20"]
    ) as s:
        yield s


async def test_multi_turn_responses_on_the_stack(stack: EngineStack, redis_url: str) -> None:
    client = openai.AsyncOpenAI(
        base_url=stack.gateway + "/v1", api_key="unused", max_retries=0, timeout=REQUEST_TIMEOUT_S
    )
    try:
        prev: str | None = None
        cached = []
        for turn in range(4):
            kw = {"previous_response_id": prev} if prev else {}
            r = await client.responses.create(
                model="tideserve-sim",
                input=words(300, f"t{turn}"),
                max_output_tokens=8,
                **kw,  # type: ignore[arg-type]
            )
            assert r.usage is not None and r.previous_response_id == prev
            cached.append(r.usage.input_tokens_details.cached_tokens)
            prev = r.id
        assert all(c > 0 for c in cached[1:]), cached
        assert prev is not None and (await client.responses.retrieve(prev)).id == prev
    finally:
        await client.close()
    recs = await request_records(redis_url, stack.deployment, 4)
    mine = [r for r in recs if r.api == "responses"]
    assert len(mine) == 4 and len({r.decode_instance for r in mine}) == 1
    assert [r.cached_tokens > 0 for r in mine] == [False, True, True, True]
