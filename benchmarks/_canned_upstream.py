"""The canned engine upstream of the gateway benchmarks: nginx serving fixed answers from a
config generated in a temp dir (Debian package ``nginx``): ``/health``, ``/metrics`` (SGLang
names, zero load), server/model info, ``/v1/models``, a non-streaming ``/v1/completions``
body, a streaming ``/v1/chat/completions`` SSE body, and the same answer as an engine
serving the agent APIs natively streams it (``/v1/messages``, ``/v1/responses``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from _harness import ProcGroup, free_port, wait_http
from _loadgen import MODEL

from services.common.apis.anthropic_stream import StreamTranslator
from services.common.apis.responses import parse_responses
from services.common.apis.responses_stream import ChatToResponses

__all__ = ["native_streams", "nginx_config", "start_canned_upstream"]


def _q(s: str) -> str:
    """An nginx single-quoted string."""
    return "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'"


def native_streams(chat_sse: bytes, sse_chunks: int) -> dict[str, str]:
    """The canned chat stream as an engine serving the Messages and Responses APIs natively
    would stream it (the events the gateway's translators write for it)."""
    req = parse_responses({"model": MODEL, "input": "x", "max_output_tokens": sse_chunks,
                           "stream": True, "store": False})  # fmt: skip
    responses = ChatToResponses(req, "resp_canned", 1, False)
    messages = StreamTranslator(model=MODEL, input_tokens=128)
    return {
        "responses": (responses.feed(chat_sse) + responses.final()).decode(),
        "messages": (messages.feed(chat_sse) + messages.final()).decode(),
    }


def chat_stream(sse_chunks: int) -> bytes:
    """The canned chat stream: ``sse_chunks`` one-token chunks, usage on the last."""
    usage = {"prompt_tokens": 128, "completion_tokens": sse_chunks,
             "total_tokens": 128 + sse_chunks, "prompt_tokens_details": {"cached_tokens": 0}}  # fmt: skip
    events = []
    for i in range(sse_chunks):
        last = i == sse_chunks - 1
        chunk: dict[str, Any] = {
            "id": "chatcmpl-canned", "object": "chat.completion.chunk", "created": 1,
            "model": MODEL, "choices": [{"index": 0, "delta": {"content": " tok"},
                                         "logprobs": None,
                                         "finish_reason": "length" if last else None}],
        }  # fmt: skip
        if last:
            chunk["usage"] = usage
        events.append("data: " + json.dumps(chunk) + "\n\n")
    return ("".join(events) + "data: [DONE]\n\n").encode()


def nginx_config(workdir: Path, port: int, sse_chunks: int) -> Path:
    model_dir = workdir / "model"
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.json").write_text(
        json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}) + "\n"
    )
    info = {"model_path": str(model_dir), "tokenizer_path": str(model_dir),
            "served_model_name": MODEL, "is_generation": True, "max_context_length": 32768,
            "disaggregation_mode": "null", "page_size": 64,
            "internal_states": [{"num_running_reqs": 0, "num_queue_reqs": 0}]}  # fmt: skip
    models = {"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "nginx",
              "root": str(model_dir), "max_model_len": 32768}]}  # fmt: skip
    usage = {"prompt_tokens": 128, "completion_tokens": sse_chunks,
             "total_tokens": 128 + sse_chunks, "prompt_tokens_details": {"cached_tokens": 0}}  # fmt: skip
    completion = {"id": "cmpl-canned", "object": "text_completion", "created": 1, "model": MODEL,
                  "choices": [{"index": 0, "text": " ".join(["tok"] * sse_chunks),
                               "logprobs": None, "finish_reason": "length"}], "usage": usage}  # fmt: skip
    sse = chat_stream(sse_chunks).decode()
    native = native_streams(sse.encode(), sse_chunks)
    metrics = "".join(
        f'sglang:{n}{{model_name="{MODEL}"}} 0.0\n'
        for n in ("num_running_reqs", "num_queue_reqs", "num_used_tokens", "token_usage",
                  "cache_hit_rate", "gen_throughput")
    )  # fmt: skip
    json_routes = {
        "/health": ("text/plain", ""), "/health_generate": ("text/plain", ""),
        "/get_server_info": ("application/json", json.dumps(info)),
        "/server_info": ("application/json", json.dumps(info)),
        "/get_model_info": ("application/json", json.dumps(info)),
        "/model_info": ("application/json", json.dumps(info)),
        "/v1/models": ("application/json", json.dumps(models)),
        "/metrics": ("text/plain; version=0.0.4", metrics),
        "/v1/completions": ("application/json", json.dumps(completion)),
        "/generate": ("application/json", json.dumps({"text": "tok", "meta_info": usage})),
        "/v1/chat/completions": ("text/event-stream", sse),
    }  # fmt: skip
    locations = "\n".join(
        f"    location = {path} {{ default_type {_q(ctype)}; return 200 {_q(body)}; }}"
        for path, (ctype, body) in json_routes.items()
    )
    # Bodies past nginx's 4 KiB parameter limit are files, answered to POST through the
    # internal redirect error_page makes (a GET of the file, with status 200).
    canned = workdir / "canned"
    canned.mkdir(exist_ok=True)
    for api, body in native.items():
        (canned / f"{api}.sse").write_text(body, encoding="utf-8")
        locations += (f"\n    location = /v1/{api} {{ error_page 405 =200 /canned/{api}.sse; "
                      "return 405; }")  # fmt: skip
    locations += (f"\n    location /canned/ {{ internal; alias {canned}/; "
                  "default_type 'text/event-stream'; }")  # fmt: skip
    tmp = workdir / "tmp"
    tmp.mkdir(exist_ok=True)
    conf = f"""worker_processes 1;
daemon off;
master_process off;
pid {workdir / "nginx.pid"};
error_log {workdir / "error.log"} warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {tmp / "body"};
  proxy_temp_path {tmp / "proxy"};
  fastcgi_temp_path {tmp / "fastcgi"};
  uwsgi_temp_path {tmp / "uwsgi"};
  scgi_temp_path {tmp / "scgi"};
  keepalive_requests 10000000;
  keepalive_timeout 300s;
  client_max_body_size 64m;
  client_body_buffer_size 1m;
  server {{
    listen 127.0.0.1:{port} backlog=4096;
{locations}
    location / {{ return 404; }}
  }}
}}
"""
    path = workdir / "nginx.conf"
    path.write_text(conf, encoding="utf-8")
    return path


# -- phases ----------------------------------------------------------------------------------


def start_canned_upstream(group: ProcGroup, workdir: Path, sse_chunks: int = 8) -> str:
    """Start the canned nginx upstream (:func:`nginx_config`) in ``group``; its base URL
    once it answers ``/health``."""
    nport = free_port()
    conf = nginx_config(workdir, nport, sse_chunks)
    group.start("nginx", ["nginx", "-p", str(workdir), "-c", str(conf), "-e", "stderr"])
    upstream = f"http://127.0.0.1:{nport}"
    wait_http(upstream + "/health", group, 20.0)
    return upstream
