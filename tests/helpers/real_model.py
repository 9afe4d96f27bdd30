"""A tiny random-weight Llama that real vLLM serves on this machine's CPU, made at test time:
the BPE tokenizer of :mod:`tests.helpers.model_dir` with a chat template that knows tools, and
weights written by ``scripts/tiny_model_weights.py`` run in the vLLM virtualenv (torch and
transformers live there, not in the project's environment)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.helpers.model_dir import write_model_dir

__all__ = ["TOOLS_TEMPLATE", "write_real_model"]

ROOT = Path(__file__).resolve().parents[2]

# Hermes-like: tools listed in a system header, assistant tool calls as <tool_call> JSON,
# tool results as their own role. Refuses unknown roles, as real templates do.
TOOLS_TEMPLATE = (
    "{{ bos_token }}"
    "{% if tools %}<|system|>\ntools: {{ tools | tojson }}{{ eos_token }}\n{% endif %}"
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant', 'tool'] %}"
    "{{ raise_exception('unknown role ' + message['role']) }}"
    "{% endif %}"
    "<|{{ message['role'] }}|>\n"
    "{% if message['content'] is string %}{{ message['content'] | trim }}{% endif %}"
    "{% if message['tool_calls'] is defined %}{% for call in message['tool_calls'] %}"
    "<tool_call>{{ call['function']['name'] }}</tool_call>"
    "{% endfor %}{% endif %}"
    "{{ eos_token }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

_CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "a system prompt tells the assistant to be brief and precise",
    "users ask questions about caches, blocks, prefixes and tokens",
    "hello there, how are you today? I am fine, thank you.",
    "routing requests to the engine that already holds the prefix saves prefill time",
    'tools: [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]',
    "def main(): return sum(x * x for x in range(10))  # agents read and write code",
    "héllo wörld, ça va? 東京 🚀",
] * 20


def write_real_model(path: Path, vllm_python: Path, **weights: int) -> Path:
    """Tokenizer + weights in ``path``; ``weights`` are ``tiny_model_weights.py`` options
    (``hidden=512, layers=8``...). Returns ``path``."""
    write_model_dir(path, TOOLS_TEMPLATE, vocab_size=600, added_token_form=False, corpus=_CORPUS)
    args = [str(vllm_python), str(ROOT / "scripts" / "tiny_model_weights.py"), str(path)]
    for k, v in weights.items():
        args += [f"--{k.replace('_', '-')}", str(v)]
    out = subprocess.run(args, check=True, capture_output=True, text=True, timeout=300)
    json.loads(out.stdout.strip().splitlines()[-1])
    return path
