"""vLLM-style P/D flow of the gateway (``pd_protocol: vllm``), as vLLM's toy P/D proxy does it.

1. **Prefill**, not streamed: the client's body with ``max_tokens=1`` (chat: also
   ``max_completion_tokens=1`` when given; ``/generate``: ``sampling_params.max_new_tokens=1``),
   ``stream=false``, no ``stream_options``, no ``min_tokens``/``min_completion_tokens``, and
   ``kv_transfer_params = {"do_remote_decode": true, "do_remote_prefill": false,
   "remote_engine_id": null, "remote_block_ids": null, "remote_host": null,
   "remote_port": null}``. The answer is read to the end.
2. **Decode**: the client's body unchanged plus the ``kv_transfer_params`` of the prefill
   answer (when the prefill returned none, the decode instance prefills itself, as the toy
   proxy lets it); the caller sends it to the decode instance and streams it back.

Both requests carry the same ``X-Request-Id``. The engine side of the convention is
described in :mod:`services.engine.pd_vllm`.

Errors: a connection error, a 5xx, or a 200 whose body is not a JSON object, from the
prefill raise :class:`UpstreamFailure` naming the prefill instance (the gateway retries on
other endpoints before the first byte). A 4xx from the prefill is the client's problem and
is handed back unchanged (:class:`PrefillRefused`). A decode failure before its first byte
retries both halves on a new pick; the first prefill's held KV is then freed by that
engine's hold timeout (vLLM: ``VLLM_NIXL_ABORT_REQUEST_TIMEOUT``), as with the toy proxy.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

from services.common.routing.types import EndpointView
from services.scheduler.http.openai import Kind
from services.scheduler.http.upstream import UpstreamFailure, open_upstream

__all__ = ["PREFILL_PARAMS", "PrefillRefused", "decode_body", "prefill_body", "run_prefill"]

PREFILL_PARAMS: Mapping[str, Any] = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}


@dataclass(frozen=True, slots=True)
class PrefillRefused:
    """The prefill instance refused the request (4xx): answer the client with this."""

    status: int
    body: bytes
    content_type: str


def prefill_body(kind: Kind, body: Mapping[str, Any]) -> dict[str, Any]:
    """The prefill half of ``body`` (pure; ``body`` is not modified)."""
    out = {k: v for k, v in body.items() if k not in ("stream_options", "min_tokens")}
    out.pop("min_completion_tokens", None)
    out["stream"] = False
    out["kv_transfer_params"] = dict(PREFILL_PARAMS)
    if kind == "generate":
        sp = dict(out.get("sampling_params") or {})
        sp["max_new_tokens"] = 1
        out["sampling_params"] = sp
    else:
        out["max_tokens"] = 1
        if "max_completion_tokens" in out:
            out["max_completion_tokens"] = 1
    return out


def decode_body(body: Mapping[str, Any], prefill_answer: Mapping[str, Any]) -> dict[str, Any]:
    """The decode half: ``body`` plus the prefill answer's ``kv_transfer_params`` (pure)."""
    out = dict(body)
    kv = prefill_answer.get("kv_transfer_params")
    if isinstance(kv, Mapping) and kv:
        out["kv_transfer_params"] = dict(kv)
    return out


async def run_prefill(
    session: aiohttp.ClientSession,
    prefill: EndpointView,
    kind: Kind,
    path: str,
    body: Mapping[str, Any],
    headers: Mapping[str, str],
    client_timeout: aiohttp.ClientTimeout,
) -> dict[str, Any] | PrefillRefused:
    """Run step 1 on ``prefill``; return the decode body (step 2) or the refusal.
    Raises :class:`UpstreamFailure` (see the module doc)."""
    pid = prefill.instance_id
    resp = await open_upstream(
        session, prefill, path, prefill_body(kind, body), headers, client_timeout
    )
    try:
        data = await resp.read()
    except (aiohttp.ClientError, TimeoutError, OSError) as e:
        raise UpstreamFailure(pid, f"prefill read: {e!r}") from None
    finally:
        resp.release()
    if resp.status != 200:
        return PrefillRefused(resp.status, data, resp.content_type or "application/json")
    try:
        answer = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        answer = None
    if not isinstance(answer, dict):
        raise UpstreamFailure(pid, "prefill answer is not a JSON object")
    return decode_body(body, answer)
