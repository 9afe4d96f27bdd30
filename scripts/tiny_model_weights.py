"""Write a random-weight Llama (config.json + model.safetensors) into a model directory that
already holds its tokenizer (tokenizer.json). Runs in the vLLM virtualenv (it needs torch and
transformers, which the project's own environment does not install):

    .venv-vllm/bin/python scripts/tiny_model_weights.py DIR [--hidden 64 --layers 2 ...]

The defaults make a model of under 1 MB that vLLM's CPU backend serves (head_dim 32: the CPU
attention backend refuses 16). Deterministic for given arguments (seeded).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model_dir", type=Path)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--intermediate", type=int, default=0, help="0 = 2 x hidden")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=32)
    p.add_argument("--max-positions", type=int, default=8192)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = json.loads((a.model_dir / "tokenizer.json").read_text(encoding="utf-8"))
    ids = list(tok["model"]["vocab"].values()) + [t["id"] for t in tok.get("added_tokens", [])]
    vocab = max(ids) + 1
    specials = {t["content"]: t["id"] for t in tok.get("added_tokens", [])}
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=a.hidden,
        intermediate_size=a.intermediate or 2 * a.hidden,
        num_hidden_layers=a.layers,
        num_attention_heads=a.heads,
        num_key_value_heads=a.kv_heads,
        head_dim=a.head_dim,
        max_position_embeddings=a.max_positions,
        bos_token_id=specials.get("<s>", 0),
        eos_token_id=specials.get("</s>", 1),
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    torch.manual_seed(a.seed)
    model = LlamaForCausalLM(cfg)
    model.save_pretrained(a.model_dir, safe_serialization=True)
    n = sum(p.numel() for p in model.parameters())
    print(json.dumps({"model_dir": str(a.model_dir), "parameters": n, "vocab_size": vocab}))


if __name__ == "__main__":
    main()
