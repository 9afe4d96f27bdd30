"""Chat-completions answers as OpenAI Responses objects (pure): the response
(:func:`from_chat`, :func:`response_object`), its output items and usage. Requests are
parsed in :mod:`services.common.apis.responses`, streams in :mod:`.responses_stream`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from services.common import jsonfast
from services.common.apis.responses import Item, ResponsesError, ResponsesRequest, as_map

__all__ = [
    "ResponseBytes",
    "final_status",
    "from_chat",
    "function_item",
    "message_item",
    "output_items",
    "response_object",
    "response_usage",
]


def response_usage(chat_usage: Any) -> dict[str, Any] | None:
    """A chat ``usage`` in the Responses shape (None when there is none)."""
    if not isinstance(chat_usage, Mapping):
        return None
    details = chat_usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, Mapping) else 0
    inp, out = (
        int(chat_usage.get("prompt_tokens") or 0),
        int(chat_usage.get("completion_tokens") or 0),
    )
    return {
        "input_tokens": inp,
        "input_tokens_details": {"cached_tokens": int(cached or 0)},
        "output_tokens": out,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": inp + out,
    }


def output_items(resp_id: str, text: str | None, calls: Sequence[Mapping[str, Any]]) -> list[Item]:
    """A turn's output items: the message (when it said anything), then its tool calls
    (chat ``tool_calls`` entries); item ids derive from the response id."""
    base = resp_id.removeprefix("resp_")
    out: list[Item] = []
    if text:
        out.append(message_item(f"msg_{base}", text, "completed"))
    for i, c in enumerate(calls):
        fn = as_map(c.get("function"))
        out.append(
            function_item(
                f"fc_{base}_{i}",
                str(c.get("id") or f"call_{base}_{i}"),
                str(fn.get("name") or ""),
                str(fn.get("arguments") or ""),
                "completed",
            )
        )
    return out


def message_item(item_id: str, text: str, status: str) -> Item:
    content = [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
    return {
        "id": item_id,
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": content if text or status == "completed" else [],
    }


def function_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> Item:
    return {
        "id": item_id,
        "type": "function_call",
        "status": status,
        "arguments": arguments,
        "call_id": call_id,
        "name": name,
    }


def final_status(finish_reason: str | None) -> str:
    """A finished answer's status: ``incomplete`` when it stopped on length."""
    return "incomplete" if finish_reason == "length" else "completed"


def response_object(
    req: ResponsesRequest,
    resp_id: str,
    created_at: int,
    *,
    output: Sequence[Item] = (),
    usage: Mapping[str, Any] | None = None,
    finish_reason: str | None = "stop",
    status: str | None = None,
    error: Mapping[str, Any] | None = None,
    store: bool = False,
) -> dict[str, Any]:
    """The ``response`` object of ``req`` (``status`` from ``finish_reason`` unless given)."""
    if status is None:
        status = final_status(finish_reason)
    return {
        "id": resp_id,
        "object": "response",
        "created_at": created_at,
        "status": status,
        "background": False,
        "error": dict(error) if error else None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        **_before_output(req),
        "output": list(output),
        **_after_output(req, store),
        "usage": dict(usage) if usage is not None else None,
        "metadata": dict(req.metadata),
    }


def _before_output(req: ResponsesRequest) -> dict[str, Any]:
    """The request's fields of a response object before ``output``, in their order."""
    return {
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "model": req.model,
    }


def _after_output(req: ResponsesRequest, store: bool) -> dict[str, Any]:
    """The request's fields of a response object between ``output`` and ``usage``."""
    return {
        "parallel_tool_calls": req.parallel_tool_calls is not False,
        "previous_response_id": req.previous_response_id,
        "store": store,
        "temperature": req.temperature if req.temperature is not None else 1.0,
        "text": {"format": dict(req.text_format) if req.text_format else {"type": "text"}},
        "tool_choice": req.tool_choice or "auto",
        "tools": [{**t, "strict": t.get("strict", True)} for t in req.tools],
        "top_p": req.top_p if req.top_p is not None else 1.0,
        "truncation": "disabled",
    }


class ResponseBytes:
    """The response objects of one request as JSON, the bytes the encoder writes for
    :func:`response_object` (what the request fixes encoded once; a stream writes two or
    three of them)."""

    __slots__ = ("_after", "_before", "_head", "_metadata")

    def __init__(self, req: ResponsesRequest, resp_id: str, created_at: int, store: bool) -> None:
        self._head = b'{"id":%b,"object":"response","created_at":%b,"status":"' % (
            jsonfast.dumps(resp_id),
            jsonfast.dumps(created_at),
        )
        self._before = b"," + jsonfast.dumps(_before_output(req))[1:-1] + b',"output":'
        self._after = b"," + jsonfast.dumps(_after_output(req, store))[1:-1] + b',"usage":'
        self._metadata = b',"metadata":' + jsonfast.dumps(dict(req.metadata)) + b"}"

    def encode(
        self, status: str, output: bytes, usage: bytes = b"null", error: bytes = b"null"
    ) -> bytes:
        """The object with ``status`` (one of response_object's, no escapes) and the other
        fields given encoded: ``output`` (a list), ``usage`` and ``error`` (null: none)."""
        incomplete = b'{"reason":"max_output_tokens"}' if status == "incomplete" else b"null"
        return b"".join(
            (self._head, status.encode(), b'","background":false,"error":', error,
             b',"incomplete_details":', incomplete, self._before, output, self._after, usage,
             self._metadata)
        )  # fmt: skip


def from_chat(
    req: ResponsesRequest, resp_id: str, created_at: int, chat: Any, *, store: bool = False
) -> dict[str, Any]:
    """The ``response`` object of a whole chat completion. Raises ResponsesError when the
    answer is not a chat completion."""
    choices = chat.get("choices") if isinstance(chat, Mapping) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
        raise ResponsesError("the engine's answer is not a chat completion", None, "bad_upstream")
    msg = as_map(choices[0].get("message"))
    text = msg.get("content") if isinstance(msg.get("content"), str) else None
    calls = [c for c in msg.get("tool_calls") or [] if isinstance(c, Mapping)]
    return response_object(
        req,
        resp_id,
        created_at,
        output=output_items(resp_id, text, calls),
        usage=response_usage(chat.get("usage")),
        finish_reason=choices[0].get("finish_reason"),
        store=store,
    )
