"""Engine simulator: a GPU-free SGLang/vLLM look-alike (pure cores + an aiohttp shell)."""
