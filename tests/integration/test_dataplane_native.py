"""The data-plane wrapper over the real Mooncake Transfer Engine (TCP on loopback): two
engines in this process find each other through kvmeta's metadata endpoint (a child
process) and
move batches of byte ranges between their registered arenas, every byte checked.

Skips only when the native library cannot load (the reason names the package and libraries).
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Iterator

import pytest

from services.common.dataplane.settings import DataPlaneSettings
from services.common.dataplane.transfer import Arena, DataPlane, TransferError, TransferTimeout
from tests.helpers.dataplane import metadata_url_or_skip
from tests.helpers.ports import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

SIZE = 1 << 20


Pair = tuple[DataPlane, Arena, DataPlane, Arena]


@pytest.fixture(scope="module")
def metadata_url() -> Iterator[str]:
    yield from metadata_url_or_skip()


@pytest.fixture
async def pair(metadata_url: str) -> AsyncIterator[Pair]:
    planes: list[tuple[DataPlane, Arena]] = []
    try:
        for _ in range(2):
            dp = DataPlane(DataPlaneSettings(f"127.0.0.1:{free_port()}", metadata_url))
            await dp.start()
            arena = Arena(SIZE)
            await dp.register(arena)
            planes.append((dp, arena))
        yield planes[0][0], planes[0][1], planes[1][0], planes[1][1]
    finally:
        for dp, arena in planes:
            await dp.close()
            arena.close()


BATCHES = [
    # (op, [(length, local offset, remote offset)])
    ("read", [(1, 0, 0)]),
    ("read", [(4096, 0, 8192), (777, 5000, 100), (65536, 300000, 700000)]),
    ("write", [(128 * 1024, 0, 0), (128 * 1024, 128 * 1024, SIZE - 128 * 1024)]),
]


@pytest.mark.parametrize(
    ("op", "ranges"), BATCHES, ids=["read-1-byte", "read-3-ranges", "write-2-blocks"]
)
async def test_batch_moves_exact_bytes(
    pair: Pair, op: str, ranges: list[tuple[int, int, int]]
) -> None:
    me, mine, peer, theirs = pair
    rng = random.Random(op + str(len(ranges)))
    mine.write(0, rng.randbytes(SIZE))
    theirs.write(0, rng.randbytes(SIZE))
    src, dst = (theirs, mine) if op == "read" else (mine, theirs)
    before = dst.read(0, SIZE)
    call = me.read if op == "read" else me.write
    done = await call(
        peer.segment,
        [mine.base + lo for _, lo, _ in ranges],
        [theirs.base + ro for _, _, ro in ranges],
        [n for n, _, _ in ranges],
    )
    assert done.nbytes == sum(n for n, _, _ in ranges) and done.ms >= 0.0
    after = bytearray(before)
    for n, lo, ro in ranges:
        s_off, d_off = (ro, lo) if op == "read" else (lo, ro)
        after[d_off : d_off + n] = src.read(s_off, n)
    assert dst.read(0, SIZE) == bytes(after)  # the ranges moved, nothing else changed
    assert (me.transfers, me.failures) == (1, 0)


async def test_unknown_peer_is_a_transfer_error_and_the_engine_stays_usable(pair: Pair) -> None:
    me, mine, peer, theirs = pair
    with pytest.raises(TransferError) as err:
        await me.read(f"127.0.0.1:{free_port()}", [mine.base], [4096], [16])
    assert not isinstance(err.value, TransferTimeout)
    theirs.write(0, b"still works")
    await me.read(peer.segment, [mine.base], [theirs.base], [11])
    assert mine.read(0, 11) == b"still works" and me.failures == 1
