"""The engine simulator's ``/v1/responses`` (stateless, over its chat path), with the real
``openai`` SDK."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import openai
import pytest

from tests.helpers.engines import EngineFleet

pytestmark = pytest.mark.integration

PROMPT = " ".join(f"w{i}" for i in range(40))


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[openai.AsyncOpenAI]:
    fleet = EngineFleet(tmp_path, profile="test", speedup=50.0, block_size=16)
    _, url = await fleet.start()
    c = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    yield c
    await c.close()
    await fleet.close()


async def test_whole_and_streamed(client: openai.AsyncOpenAI) -> None:
    r = await client.responses.create(model="m", input=PROMPT, max_output_tokens=3)
    assert r.object == "response" and r.status == "incomplete" and r.output_text
    assert r.usage is not None and r.usage.output_tokens == 3 and r.usage.input_tokens == 41
    again = await client.responses.create(model="m", input=PROMPT, max_output_tokens=3)
    assert again.usage is not None and again.usage.input_tokens_details.cached_tokens == 32
    stream = await client.responses.create(
        model="m", input=PROMPT, max_output_tokens=3, stream=True
    )
    events = [e async for e in stream]
    assert events[0].type == "response.created" and events[-1].type == "response.incomplete"
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == events[-1].response.output_text  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("kw", "param", "code"),
    [
        ({"previous_response_id": "resp_x"}, "previous_response_id", "previous_response_not_found"),
        ({"tools": [{"type": "web_search"}]}, "tools", "unsupported_tool"),
    ],
    ids=["stateless", "hosted-tool"],
)
async def test_refused(
    client: openai.AsyncOpenAI, kw: dict[str, object], param: str, code: str
) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        await client.responses.create(model="m", input="x", **kw)  # type: ignore[call-overload]
    assert (err.value.param, err.value.code) == (param, code)
