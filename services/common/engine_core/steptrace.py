"""The engine simulator's step trace (``--step-trace FILE``): one JSON line per event.

A diagnostic for comparing a live engine with the pure core run in virtual time
(``benchmarks/routing_sim.py``): what each step carried and how late the shell started it.
Times are modelled milliseconds on the engine's clock (``now_ms``).

* ``{"ev": "submit", "rid", "t", "prompt", "max_new", "handler_ms"}`` — a request entered
  the core; ``handler_ms``: wall ms from the handler's entry to that (body read and parse,
  tokenisation, hashing: mostly time the event loop was held, so no step started or ended).
* ``{"ev": "step", "t", "d", "dec", "ctx", "pf", "chunks", "run", "wait", "late"}`` — a
  step of modelled duration ``d`` started at ``t`` with ``dec`` decodes over ``ctx`` context
  tokens and ``pf`` prefill tokens in ``chunks`` chunks; ``run`` / ``wait`` after planning;
  ``late``: how far the shell's wall clock was past the previous step's planned end when it
  planned this one (its overhead; 0 after an idle wait, and in the simulator). The live
  shell starts the step at the planned end all the same, up to ``catch_up_ms`` behind
  (:mod:`services.engine.pacing`).
* ``{"ev": "first", "rid", "t", "cached"}`` — a request's first output (its prefill ended).
* ``{"ev": "done", "rid", "t", "tokens"}`` — a request's last output.

Writes go through a buffered file; nothing here reads the clock.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import IO

from services.common.engine_core.core import SeqOutput, StepResult

__all__ = ["StepTrace"]


class StepTrace:
    def __init__(self, path: Path) -> None:
        self._f: IO[str] = path.open("w", encoding="utf-8", buffering=1 << 16)

    def _write(self, rec: dict[str, object]) -> None:
        self._f.write(json.dumps(rec, separators=(",", ":")) + "\n")

    def submit(self, rid: str, t: float, prompt: int, max_new: int, handler_ms: float) -> None:
        self._write(
            {"ev": "submit", "rid": rid, "t": round(t, 3), "prompt": prompt,
             "max_new": max_new, "handler_ms": round(handler_ms, 3)}
        )  # fmt: skip

    def step(self, t: float, res: StepResult, run: int, wait: int, late: float = 0.0) -> None:
        self._write(
            {"ev": "step", "t": round(t, 3), "d": round(res.duration_ms, 3),
             "dec": res.decode_tokens, "ctx": res.decode_context, "pf": res.prefill_tokens,
             "chunks": res.prefill_chunks,
             "run": run, "wait": wait, "late": round(late, 3)}
        )  # fmt: skip

    def outputs(self, end: float, outs: tuple[SeqOutput, ...]) -> None:
        for o in outs:
            # its first output (a core without token ids emits them one at a time)
            if o.completion_tokens == max(1, len(o.tokens)):
                self._write(
                    {"ev": "first", "rid": o.rid, "t": round(end, 3), "cached": o.cached_tokens}
                )
            if o.finished:
                self._write(
                    {"ev": "done", "rid": o.rid, "t": round(end, 3), "tokens": o.completion_tokens}
                )

    def close(self) -> None:
        self._f.close()
