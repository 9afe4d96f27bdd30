"""The bound pre-filter's routed-match column, read from the holder masks, is the column of
the match's dict spread over the fleet's positions."""

from __future__ import annotations

import random

import numpy as np
import pytest

from services.common.routing.plugins.routed_index import RoutedPrefixIndex
from services.sim.routed_cols import RoutedColumns


def spread(match: dict[str, int], pos: dict[str, int], n: int) -> np.ndarray:
    out = np.zeros(n)
    for iid, v in match.items():
        if iid in pos:
            out[pos[iid]] = v
    return out


@pytest.mark.parametrize("stride", [1, 4], ids=["every-block", "stride-4"])
@pytest.mark.parametrize(
    ("instances", "fleet"),
    [(6, 6), (300, 300), (300, 250)],
    ids=["few-holders", "many-holders", "some-not-in-fleet"],
)
def test_column_is_the_spread_dict(stride: int, instances: int, fleet: int) -> None:
    rng = random.Random(stride * 1000 + instances + fleet)
    idx = RoutedPrefixIndex(float(instances), 1_000_000, stride)  # slots freed and retaken
    chains = [[0, *range(c * 100 + 1, c * 100 + 1 + rng.randrange(1, 40))] for c in range(20)]
    ids = [f"w-{i}" for i in range(instances)]
    order = rng.sample(ids, fleet)  # the fleet's positions differ from the index's slots
    pos = {iid: p for p, iid in enumerate(order)}
    cols = RoutedColumns(pos, fleet)
    most = 0
    for t in range(instances * 3):
        chain = rng.choice(chains)
        idx.insert(chain[: rng.randrange(1, len(chain) + 1)], rng.choice(ids), t)
        if t % 7 == 0:
            probe = rng.choice(chains)
            m = idx.match(probe, float(t))
            assert np.array_equal(cols.column(m), spread(dict(m.items()), pos, fleet))
            most = max(most, len(m))
    assert most >= (25 if instances > 24 else 1)  # (many: both ways of reading a mask)
