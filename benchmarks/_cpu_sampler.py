"""A CPU-time sampling profiler run inside a benchmarked process (``gateway_profile.py``).

    python benchmarks/_cpu_sampler.py OUT_PREFIX [--interval-ms MS] -- <tideserve args>

runs ``tideserve <args>`` in this process with a ``SIGPROF`` interval timer: the kernel
signals the process every ``MS`` of CPU time it consumed (user + system, so a syscall's
kernel time counts; time spent runnable but not running on a busy machine does not, unlike
a wall-clock sampler such as py-spy, whose "active" samples on a loaded machine pile up at
syscall returns). Each signal records the Python stack it interrupted (the frame that made
a long C call or syscall is the one on top when the handler runs). ``SIGUSR1`` writes the
samples so far to ``OUT_PREFIX.<k>`` (k = 0, 1, ...) in the collapsed-stack format
(``frame;frame;... count``, root first, a frame as ``qualname (path``) and starts afresh,
and the cyclic garbage collector's runs and CPU seconds per generation since the previous
dump to ``OUT_PREFIX.<k>.gc`` (JSON; that time is inside the samples too: a collection runs
when an object is allocated, and its samples land on the allocating frame).
"""

from __future__ import annotations

import gc
import json
import signal
import sys
import time
from collections import Counter
from pathlib import Path
from types import CodeType, FrameType


class CpuSampler:
    def __init__(self, prefix: str, interval_s: float = 0.001) -> None:
        self.prefix = prefix
        self.interval_s = interval_s
        self.counts: Counter[tuple[CodeType, ...]] = Counter()
        self.dumps = 0
        self.gc_runs = [0, 0, 0]
        self.gc_cpu_s = [0.0, 0.0, 0.0]
        self._gc_started = 0.0

    def _gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._gc_started = time.thread_time()
        else:
            gen = info["generation"]
            self.gc_runs[gen] += 1
            self.gc_cpu_s[gen] += time.thread_time() - self._gc_started

    def _sample(self, _signum: int, frame: FrameType | None) -> None:
        codes: list[CodeType] = []
        while frame is not None:
            codes.append(frame.f_code)
            frame = frame.f_back
        self.counts[tuple(codes)] += 1

    def _dump(self, _signum: int, _frame: FrameType | None) -> None:
        counts, self.counts = self.counts, Counter()
        lines = []
        for codes, n in counts.items():
            frames = ";".join(f"{c.co_qualname} ({c.co_filename}" for c in reversed(codes))
            lines.append(f"{frames} {n}\n")
        Path(f"{self.prefix}.{self.dumps}").write_text("".join(lines), encoding="utf-8")
        gc_stats = {"runs": self.gc_runs, "cpu_s": self.gc_cpu_s}
        Path(f"{self.prefix}.{self.dumps}.gc").write_text(json.dumps(gc_stats), encoding="utf-8")
        self.gc_runs, self.gc_cpu_s = [0, 0, 0], [0.0, 0.0, 0.0]
        self.dumps += 1

    def start(self) -> None:
        signal.signal(signal.SIGPROF, self._sample)
        signal.signal(signal.SIGUSR1, self._dump)
        gc.callbacks.append(self._gc)
        signal.setitimer(signal.ITIMER_PROF, self.interval_s, self.interval_s)


def main(argv: list[str]) -> int:
    if "--" not in argv or argv.index("--") < 1:
        print(__doc__, file=sys.stderr)
        return 2
    cut = argv.index("--")
    own, rest = argv[:cut], argv[cut + 1 :]
    interval_ms = 1.0
    if "--interval-ms" in own:
        interval_ms = float(own[own.index("--interval-ms") + 1])
    CpuSampler(own[0], interval_ms / 1000.0).start()
    # The tree this script belongs to (an exported copy, for before/after runs), not
    # whatever the environment's editable install points at.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from services.cli import main as tideserve

    return tideserve(rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
