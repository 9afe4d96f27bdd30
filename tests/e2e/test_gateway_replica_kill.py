"""Gateway replica killed, affinity kept, through the local stack (issue 5).

`tideserve up --engines 3 --gateways 2` runs two scheduler replicas (`scheduler`,
`scheduler-2`) listening on ONE gateway address (SO_REUSEPORT) and sharing routed prefixes and
in-flight load through Redis. Multi-turn sessions go through that address with a fresh
connection per request, so the kernel spreads them over both replicas; the
``x-tideserve-replica`` response header says which replica answered and the request records
on ``ts:requests`` which engine served each turn. The replica that alone served the most
sessions is SIGKILLed (pid from `tideserve status --json`); the next turn of every session,
through the same address, is answered by the survivor on the engine that holds the session's
prefix, from that engine's cache, and the stack keeps running.

Why this can fail: the stack's kvmeta lookups are switched off here (``kvmeta_address: ""``),
so the survivor's only prefix knowledge is its own routed-prefix index. For the sessions only
the killed replica ever routed, that index holds something solely through the shared stream:
the survivor's predicted cached tokens for them are > 0 only with sharing (without it they
are 0 and the pick is a load/tie-break decision), and the sessions sit on at least two
engines, so one tie-break winner could not keep them all.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from collections import Counter
from typing import Any

import aiohttp
import psutil
import pytest
from tideserve.v1 import events_pb2

from services.common.local.procs import ProcRef, is_alive, same_start
from services.scheduler.main import REPLICA_HEADER
from tests.helpers.engine_stack import request_records
from tests.helpers.ports import free_ports
from tests.helpers.stack import RunningStack, running_stack, status_json

pytestmark = pytest.mark.e2e

SERVICES = ("scheduler", "kvmeta", "autoscaler", "telemetry")
REPLICAS = ("scheduler", "scheduler-2")
EARLY = 4  # sessions with two turns before the kill
LATE = 4  # sessions with one turn before the kill: each is routed by one replica only
WORDS = 640  # 10 blocks of 64 tokens


def _config(deployment: str) -> dict[str, Any]:
    ports = iter(free_ports(10))
    layout: dict[str, Any] = {s: {"grpc_port": next(ports), "metrics_port": 0} for s in SERVICES}
    layout["scheduler"].update(
        http_port=next(ports),
        deployment=deployment,
        health_interval_s=0.5,
        share_heartbeat_s=0.2,
        share_heartbeat_ttl_s=1.0,
        kvmeta_address="",  # see the module doc: only the shared state can carry affinity
    )
    layout["kvmeta"]["metadata_http_port"] = next(ports)
    layout["stack"] = {
        "service_restarts": 0,  # the killed replica stays dead: the survivor alone serves
        "engine_ports": [next(ports) for _ in range(3)],
        "gateway_grpc_ports": [next(ports)],
    }
    return layout


async def _applied(http: aiohttp.ClientSession, base: str, replica: str) -> float:
    """``tideserve_gateway_shared_total{event="applied"}`` of ``replica``, asked through the
    shared address until that replica answers (-1 if it never does)."""
    for _ in range(200):
        async with http.get(base + "/metrics") as r:
            if r.headers.get(REPLICA_HEADER) != replica:
                continue
            for line in (await r.text()).splitlines():
                if line.startswith("tideserve_gateway_shared_total{") and '"applied"' in line:
                    return float(line.rsplit(" ", 1)[1])
            return 0.0
    return -1.0


def _describe(recs: list[events_pb2.RequestRecord]) -> str:
    """One line per record, by session and arrival: what a failure needs to be explained."""
    rows = sorted(recs, key=lambda r: (r.session_id, r.arrival_ms))
    return "\n".join(
        f"{r.session_id} t={r.arrival_ms} replica={r.replica_id} engine={r.decode_instance} "
        f"cached={r.cached_tokens} predicted={r.predicted_cached_tokens} queue_ms={r.queue_ms:.0f} "
        f"scores={[(s.plugin, round(s.score, 3)) for s in r.scores]}"
        for r in rows
    )


def _exists(ref: ProcRef) -> bool:
    """True while ``ref``'s process exists at all, zombies included."""
    try:
        return ref.create_time is not None and same_start(psutil.Process(ref.pid), ref.create_time)
    except psutil.NoSuchProcess:
        return False


async def test_gateway_replica_killed_affinity_kept_through_the_stack(
    postgres_url: str, redis_url: str
) -> None:
    dep = f"e2e-gw-{uuid.uuid4().hex[:8]}"  # own streams in the shared Redis
    config = _config(dep)
    flags = ["--engines", "3", "--gateways", "2", "--engine-profile", "test",
             "--engine-speedup", "20", "--engine-kv-blocks", "512"]  # fmt: skip
    with running_stack(config, flags, postgres_url=postgres_url, redis_url=redis_url) as stack:
        await _run(stack, config, dep, redis_url)
    # `up` reported the death and kept going until `down`
    assert "the stack keeps running without it" in stack.err, stack.err


async def _run(stack: RunningStack, config: dict[str, Any], dep: str, redis_url: str) -> None:
    base = f"http://127.0.0.1:{config['scheduler']['http_port']}"
    procs = {p.name: p for p in stack.state.processes}
    assert stack.state.gateway_url == base + "/v1"
    assert [n for n in procs if n.startswith("scheduler")] == list(REPLICAS)
    assert procs["scheduler-2"].grpc_address == (
        f"127.0.0.1:{config['stack']['gateway_grpc_ports'][0]}"
    )

    sessions = EARLY + LATE
    salt = uuid.uuid4().hex[:6]
    prompts = [" ".join(f"s{s}{salt}w{i}" for i in range(WORDS)) for s in range(sessions)]
    served_by: dict[int, list[str]] = {s: [] for s in range(sessions)}
    # a fresh TCP connection per request: the kernel picks the replica for each one
    connector = aiohttp.TCPConnector(force_close=True)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:

        async def turn(s: int, extra: str) -> dict[str, Any]:
            prompts[s] += " " + extra
            body = {"model": "tideserve-sim", "prompt": prompts[s], "max_tokens": 16}
            headers = {"X-Tideserve-Session": f"{dep}-s{s}"}
            async with http.post(base + "/v1/completions", json=body, headers=headers) as r:
                data: dict[str, Any] = await r.json()
                assert r.status == 200, data
                served_by[s].append(r.headers[REPLICA_HEADER])
            prompts[s] += " " + data["choices"][0]["text"]
            return data

        await asyncio.gather(*(turn(s, "hello") for s in range(sessions)))
        second = await asyncio.gather(*(turn(s, "and then") for s in range(EARLY)))
        # affinity across replicas already: the second turn hit the first turn's cache
        missed = [
            s
            for s, d in enumerate(second)
            if not d["usage"]["prompt_tokens_details"]["cached_tokens"]
        ]
        if missed:  # say why: each turn's replica, engine and the chosen engine's scores
            recs = await request_records(redis_url, dep, EARLY * 2 + LATE)
            raise AssertionError(f"second turns {missed} missed; {served_by}\n{_describe(recs)}")
        before = EARLY * 2 + LATE
        assert {n for r in served_by.values() for n in r} <= set(REPLICAS), served_by

        # The victim: the replica that alone routed the most sessions (the survivor never saw
        # those); ties go to the one that answered more requests.
        alone = Counter(r[0] for r in served_by.values() if len(set(r)) == 1)
        answered = Counter(name for r in served_by.values() for name in r)
        victim = max(REPLICAS, key=lambda n: (alone[n], answered[n]))
        survivor = next(n for n in REPLICAS if n != victim)
        victim_only = [s for s, r in served_by.items() if set(r) == {victim}]
        assert len(victim_only) >= LATE // 2, served_by  # by construction of the late sessions

        # The victim flushed its request records, and the survivor applied the victim's
        # routed prefixes (it answers /metrics on the shared address when the kernel says).
        assert len(await request_records(redis_url, dep, before)) == before
        deadline = time.monotonic() + 30
        while (applied := await _applied(http, base, survivor)) < answered[victim]:
            assert time.monotonic() < deadline, (applied, answered)
            await asyncio.sleep(0.2)

        code, report = await asyncio.to_thread(status_json, stack.state_dir)
        assert code == 0, report
        pids = {s["name"]: s["pid"] for s in report["services"]}
        assert set(REPLICAS) <= set(pids)
        entry = procs[victim]
        assert pids[victim] == entry.pid
        os.kill(entry.pid, signal.SIGKILL)
        ref = ProcRef(entry.name, entry.pid, entry.create_time)
        deadline = time.monotonic() + 30
        # Until `up` has reaped it: a killed multi-threaded process can look like a zombie
        # while its other threads still hold its sockets, and a connection the kernel queues
        # on a listener that is closing is reset (a client would see that and retry).
        while _exists(ref):
            assert time.monotonic() < deadline, "the killed replica was not reaped"
            await asyncio.sleep(0.1)
        assert not is_alive(ref)

        after = {s: await turn(s, "finally") for s in range(sessions)}

    assert all(served_by[s][-1] == survivor for s in range(sessions)), served_by
    recs = await request_records(redis_url, dep, before + sessions)
    by_session: dict[int, list[events_pb2.RequestRecord]] = {}
    for r in sorted(recs, key=lambda r: r.arrival_ms):  # a session's turns are sequential
        by_session.setdefault(int(r.session_id.rsplit("-s", 1)[1]), []).append(r)
    engines = {s: by_session[s][0].decode_instance for s in range(sessions)}
    detail = {s: [(t.decode_instance, t.cached_tokens, t.predicted_cached_tokens)
                  for t in by_session[s]] for s in range(sessions)}  # fmt: skip
    # Precondition: the sessions sit on at least two engines (no single tie-break winner).
    assert len(set(engines.values())) >= 2, detail
    for s in range(sessions):
        turns = by_session[s]
        assert len(turns) == len(served_by[s]), detail
        # affinity kept: every turn, before and after the kill, on the session's engine
        assert {t.decode_instance for t in turns} == {engines[s]}, (s, detail)
        # ... served from that engine's prefix cache
        cached = after[s]["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert cached > 0 and turns[-1].cached_tokens == cached, (s, detail)
    for s in victim_only:
        # the survivor expected the cache hit: its index knew the prefix, and for these
        # sessions only the victim's shared entries could have told it
        assert by_session[s][-1].predicted_cached_tokens > 0, (s, detail)

    # the stack is still up without the victim; status lists both replicas and says so
    assert stack.up.poll() is None
    code, report = await asyncio.to_thread(status_json, stack.state_dir)
    assert code == 1, report  # not everything is SERVING any more
    health = {s["name"]: (s["alive"], s["health"]) for s in report["services"]}
    assert health[victim] == (False, "UNREACHABLE")
    assert health[survivor] == (True, "SERVING")
    assert report["gateway_url"] == base + "/v1"
