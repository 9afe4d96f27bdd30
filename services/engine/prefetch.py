"""Prefetch jobs of the engine simulator (shell): kvmeta's retention controller names a
session's chain of block hashes, the engine brings the part it lacks back from the KV-cache
tier ahead of the session's next turn (:meth:`~services.engine.tier_io.TierIO.prefetch`).

A job is identified by the caller's ``id`` (one per session and turn); starting an id that
is pending or done again is a no-op, so a controller may repeat itself. Each job runs as a
background task; :meth:`Prefetcher.report` says, per id, ``pending``, ``done`` (every block
of the chain resident when it ended) or ``failed`` (why, in ``error``), with the blocks
found resident and fetched. The newest ``keep`` finished jobs are kept for the report.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from services.engine.tier_io import TierIO

__all__ = ["PrefetchJob", "Prefetcher", "parse_jobs"]

PENDING, DONE, FAILED = "pending", "done", "failed"


@dataclass
class PrefetchJob:
    id: str
    hashes: tuple[int, ...]
    tenant: str = ""
    state: str = PENDING
    resident: int = 0  # blocks of the chain already resident when it started
    fetched: int = 0  # blocks brought back from the tier
    error: str = ""

    def view(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "blocks": len(self.hashes),
            "resident": self.resident,
            "fetched": self.fetched,
            "error": self.error,
        }


def parse_jobs(body: dict[str, Any]) -> list[PrefetchJob]:
    """The ``prefetch`` field of a retention POST: a list of ``{"id": str, "hashes": [int],
    "tenant": str}``; ValueError for anything else."""
    raw = body.get("prefetch", [])
    if not isinstance(raw, list):
        raise ValueError("'prefetch' must be a list of jobs")
    jobs: list[PrefetchJob] = []
    for j in raw:
        if not isinstance(j, dict) or not isinstance(j.get("id"), str) or not j["id"]:
            raise ValueError("a prefetch job needs a non-empty string 'id'")
        hashes = j.get("hashes")
        if (
            not isinstance(hashes, list)
            or not hashes
            or not all(isinstance(h, int) and not isinstance(h, bool) and h >= 0 for h in hashes)
        ):
            raise ValueError("a prefetch job's 'hashes' must be block hashes (integers >= 0)")
        tenant = j.get("tenant", "")
        if not isinstance(tenant, str):
            raise ValueError("a prefetch job's 'tenant' must be a string")
        jobs.append(PrefetchJob(j["id"], tuple(hashes), tenant))
    return jobs


class Prefetcher:
    def __init__(self, tier_io: TierIO | None = None, *, keep: int = 1024) -> None:
        """``tier_io``: set once the engine's link to the tier is up (None: no tier, every
        job fails at once)."""
        self.tier_io = tier_io
        self.keep = keep
        self._jobs: OrderedDict[str, PrefetchJob] = OrderedDict()
        self._tasks: set[asyncio.Task[None]] = set()
        self.started = 0

    def start(self, jobs: list[PrefetchJob]) -> int:
        """Start the jobs whose id is new or failed before; returns how many started."""
        n = 0
        for job in jobs:
            old = self._jobs.get(job.id)
            if old is not None and old.state != FAILED:
                continue
            self._jobs[job.id] = job
            self._jobs.move_to_end(job.id)
            n += 1
            if self.tier_io is None:
                job.state, job.error = FAILED, "this engine has no KV-cache tier"
                continue
            task = asyncio.create_task(self._run(self.tier_io, job), name="engine-prefetch")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        self.started += n
        self._trim()
        return n

    async def _run(self, tier_io: TierIO, job: PrefetchJob) -> None:
        try:
            got = await tier_io.prefetch(job.hashes, job.tenant)
        except Exception as err:  # a job must end, whatever went wrong
            job.state, job.error = FAILED, f"prefetch failed: {err}"
            return
        job.resident, job.fetched, job.error = got.resident, got.fetched, got.error
        job.state = FAILED if got.error else DONE

    def _trim(self) -> None:
        done = [k for k, j in self._jobs.items() if j.state != PENDING]
        for k in done[: max(0, len(self._jobs) - self.keep)]:
            del self._jobs[k]

    @property
    def pending_blocks(self) -> int:
        """Blocks of the chains of jobs not finished yet."""
        return sum(len(j.hashes) for j in self._jobs.values() if j.state == PENDING)

    def report(self) -> dict[str, dict[str, Any]]:
        return {k: j.view() for k, j in self._jobs.items()}

    async def close(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        for t in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await t
