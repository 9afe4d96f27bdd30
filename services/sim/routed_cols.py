"""A routed-prefix match as a column over a fleet snapshot's positions (for the bound
pre-filter, :mod:`services.sim.bound`): read from the match's holder masks over the
index's slots, not from the dict of instance ids the match stands for (at a thousand
instances it names hundreds of them per request). The same column as spreading that dict
(``tests/unit/test_sim_routed_cols.py``)."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from services.common.routing.plugins.routed_match import RoutedMatch, Slots, set_bits

__all__ = ["RoutedColumns"]

_FEW = 24  # masks with at most this many holders are read bit by bit


class RoutedColumns:
    """Columns of routed matches over the positions ``pos`` (instance id -> position) of a
    fleet of ``n``; the index's slots are mapped to positions once per slot assignment."""

    def __init__(self, pos: dict[str, int], n: int) -> None:
        self.pos, self.n = pos, n
        self._slots: Slots | None = None
        self._at: npt.NDArray[np.intp] = np.zeros(0, dtype=np.intp)
        self._at_list: list[int] = []

    def _positions(self, slots: Slots) -> tuple[npt.NDArray[np.intp], list[int]]:
        """Each slot's position (-1: not in this fleet, or a free slot)."""
        if slots is not self._slots:
            get = self.pos.get
            self._at_list = [get(iid, -1) if iid else -1 for iid in slots.iids]
            self._at = np.array(self._at_list, dtype=np.intp)
            self._slots = slots
        return self._at, self._at_list

    def column(self, m: RoutedMatch) -> npt.NDArray[np.float64]:
        """``m``'s length per position (0 where it has none), its writes in order."""
        out = np.zeros(self.n)
        if not m.writes:
            return out
        at, at_list = self._positions(m.slots)
        for bits, length in m.writes:
            if bits.bit_count() <= _FEW:
                for s in set_bits(bits):
                    i = at_list[s]
                    if i >= 0:
                        out[i] = length
                continue
            raw = bits.to_bytes((bits.bit_length() + 7) // 8, "little")
            flags = np.unpackbits(np.frombuffer(raw, dtype=np.uint8), bitorder="little")
            k = min(len(flags), len(at))
            sel = at[:k][flags[:k].view(bool)]
            out[sel[sel >= 0]] = length
        return out
