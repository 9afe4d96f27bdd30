"""``python -m services.kvbridge`` as a process: bridges, then stops cleanly on SIGTERM."""

from __future__ import annotations

import asyncio
import signal
import sys
import uuid
from typing import Any

import pytest
import zmq
import zmq.asyncio
from tideserve.v1 import events_pb2

from services.common.streams import decode_entry
from tests.unit._kv_bridge_helpers import frames, vllm_payload, vllm_stored

pytestmark = pytest.mark.integration

WAIT_S = 30.0


async def test_process_bridges_and_stops_on_sigterm(redis_client: Any, redis_url: str) -> None:
    ctx = zmq.asyncio.Context()
    pub = ctx.socket(zmq.XPUB)
    pub.setsockopt(zmq.LINGER, 0)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    deployment = f"proc-{uuid.uuid4().hex[:8]}"
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "services.kvbridge",
        "--endpoint",
        f"tcp://127.0.0.1:{port}",
        "--deployment",
        deployment,
        "--instance-id",
        "w0",
        "--redis-url",
        redis_url,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        sub = await asyncio.wait_for(pub.recv(), WAIT_S)
        assert sub[:1] == b"\x01"
        for seq in range(3):
            await pub.send_multipart(frames(seq, vllm_payload([vllm_stored([seq + 1])])))
        stream = f"ts:kv:{deployment}"
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WAIT_S
        got: list[Any] = []
        while len(got) < 3 and loop.time() < deadline:
            got = list(await redis_client.xrange(stream))
            await asyncio.sleep(0.05)
        msgs = [decode_entry(f, events_pb2.KVEventBatch) for _, f in got]
        assert [(m.instance_id, m.seq, m.events[0].block_hashes[0]) for m in msgs] == [
            ("w0", 1, 1),
            ("w0", 2, 2),
            ("w0", 3, 3),
        ]
        proc.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(proc.wait(), WAIT_S)
        _, err = await proc.communicate()
        assert code == 0, err.decode()[-2000:]
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        pub.close(linger=0)
        ctx.destroy(linger=0)
