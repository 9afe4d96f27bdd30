"""Process-level tuning for services with a per-request hot path (the gateway).

- :func:`run`: run the service's main coroutine on uvloop (default; less CPU per request
  than asyncio's loop: ``benchmarks/README.md`` section 2) or asyncio's own loop;
  :func:`use_uvloop` makes a later ``asyncio.run`` use uvloop (the scheduler service).
- :func:`settle_heap`: call once start-up is done. Everything built so far (modules,
  settings, the app, clients) lives as long as the process: ``gc.freeze()`` takes it out of
  the cyclic collector's scans, and the young generation's threshold goes from 700 to 20,000
  allocations, so collections run about 30x less often; each scans only what requests keep
  alive. Measured on the gateway (``gateway_profile.py``, 128-token requests): collector
  CPU per request 66 -> 10 µs.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Coroutine
from typing import Any, Literal, TypeVar

__all__ = ["EventLoop", "run", "settle_heap", "use_uvloop"]

T = TypeVar("T")

EventLoop = Literal["uvloop", "asyncio"]

YOUNG_THRESHOLD = 20_000


def run(main: Coroutine[Any, Any, T], loop: EventLoop = "uvloop") -> T:
    """``asyncio.run(main)`` on the chosen event loop implementation."""
    if loop == "uvloop":
        import uvloop

        return uvloop.run(main)
    return asyncio.run(main)


def use_uvloop() -> None:
    """Make ``asyncio.run`` (as :func:`services.common.server.run_service` calls it) run on
    uvloop in this process: for service ``main`` functions, before they run."""
    import uvloop

    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def settle_heap() -> None:
    """Freeze what start-up built and collect the young generation less often (see the
    module doc). Idempotent."""
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, max(older, 20), max(oldest, 20))
