"""A benchmark killed with SIGTERM stops the processes it started (engines, routers, a nested
comparison's fleet) instead of orphaning them. Each case runs a small script over the real
``benchmarks/_harness.py``, kills it, and waits for its descendants to be gone."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

BENCH_DIR = Path(__file__).resolve().parents[2] / "benchmarks"

# Starts a long-lived child in a ProcGroup, prints its pid, then waits for a signal.
FLEET = textwrap.dedent(
    """
    import sys, tempfile, threading
    from pathlib import Path
    sys.path.insert(0, sys.argv[1])
    from _harness import ProcGroup
    group = ProcGroup(Path(tempfile.mkdtemp()))
    try:
        child = group.start("engine", [sys.executable, "-c", "import time; time.sleep(600)"])
        print(child.proc.pid, flush=True)
        threading.Event().wait()
    finally:
        group.stop()
    """
)

# Runs FLEET as a child through run_child, forwarding its output (the grandchild's pid).
NESTED = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, sys.argv[1])
    from _harness import run_child, unwind_on_sigterm
    unwind_on_sigterm()
    run_child([sys.executable, sys.argv[2], sys.argv[1]])
    """
)


@pytest.mark.parametrize("nested", [False, True], ids=["proc-group", "run-child-of-proc-group"])
def test_sigterm_stops_what_the_script_started(tmp_path: Path, nested: bool) -> None:
    fleet = tmp_path / "fleet.py"
    fleet.write_text(FLEET, encoding="utf-8")
    argv = [sys.executable, str(fleet), str(BENCH_DIR)]
    if nested:
        outer = tmp_path / "outer.py"
        outer.write_text(NESTED, encoding="utf-8")
        argv = [sys.executable, str(outer), str(BENCH_DIR), str(fleet)]
    with subprocess.Popen(argv, stdout=subprocess.PIPE, text=True) as script:
        assert script.stdout is not None
        line = script.stdout.readline()  # the engine is running once its pid is printed
        assert line.strip().isdigit(), f"script printed {line!r}, exit {script.poll()}"
        engine = psutil.Process(int(line))
        script.send_signal(signal.SIGTERM)
        assert script.wait(timeout=60) == 143
        engine.wait(timeout=60)  # raises TimeoutExpired if the engine was orphaned
