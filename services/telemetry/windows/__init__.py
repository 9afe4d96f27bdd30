"""Pure core of telemetry's windows (no I/O; ``now`` is always passed in).

- :mod:`.validate`: one record -> accepted, or the reason it is rejected;
- :mod:`.bucket`: per-slice 1-minute buckets (counts, sums and DDSketches) and the rule that
  spreads one record over its slices;
- :mod:`.stats`: a window's :class:`WindowStats` from merged buckets;
- :mod:`.codec`: a bucket <-> bytes (exact round trip, for persisted rollups);
- :mod:`.memory`: the recent buckets one replica holds in memory.
"""
