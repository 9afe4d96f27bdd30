"""A routed-prefix index's match as a mapping that is built only when iterated (pure).

A large fleet's match holds hundreds of instances (every instance a common system prompt
was routed to), while a routing cycle reads a few of them; building the dict was most of a
match's cost. :class:`RoutedMatch` keeps what the index computed, holder bitmasks over the
index's instance slots, and answers ``get``, ``in`` and :meth:`RoutedMatch.longest` from
them; ``len``, iteration, ``keys``/``values``/``items`` build the dict once (the same keys,
values and order as the index built before). ``tests/unit/test_routing_routed_index_bits.py``
holds it to that dict.
"""

from __future__ import annotations

from collections.abc import ItemsView, Iterator, KeysView, Mapping, Sequence, ValuesView
from itertools import chain, repeat
from operator import getitem
from typing import TypeVar, overload

__all__ = ["RoutedMatch", "Slots", "set_bits"]

_T = TypeVar("_T")


class Slots:
    """An index's instance ids by slot (``iids``) and slots by id (``of``), as they were
    when a match was made (the index makes a new one when they change)."""

    __slots__ = ("iids", "of")

    def __init__(self, iids: Sequence[str]) -> None:
        self.iids = tuple(iids)
        self.of = {iid: s for s, iid in enumerate(self.iids) if iid}


class RoutedMatch(Mapping[str, int]):
    """Matched prefix length in blocks per instance (only instances with > 0).

    ``writes`` are ``(holder mask, length)`` pairs in order: the instances of the mask's
    set bits (``slots.iids``) have that length, a later write overriding an earlier one
    (the dict's order: each instance's first write, lowest slot first within a write)."""

    __slots__ = ("_dict", "slots", "writes")

    def __init__(self, writes: list[tuple[int, int]], slots: Slots) -> None:
        self.writes = writes
        self.slots = slots
        self._dict: dict[str, int] | None = None

    def _built(self) -> dict[str, int]:
        d = self._dict
        if d is None:
            d = {}
            iid_of = self.slots.iids.__getitem__
            for bits, n in self.writes:
                d.update(zip(map(iid_of, set_bits(bits)), repeat(n)))
            self._dict = d
        return d

    @overload
    def get(self, key: str, /) -> int | None: ...
    @overload
    def get(self, key: str, /, default: int) -> int: ...
    @overload
    def get(self, key: str, /, default: _T) -> int | _T: ...
    def get(self, key: str, /, default: object = None) -> object:
        if self._dict is not None:
            return self._dict.get(key, default)
        slot = self.slots.of.get(key)
        if slot is None:
            return default
        for bits, n in reversed(self.writes):
            if bits >> slot & 1:
                return n
        return default

    def __getitem__(self, key: str) -> int:
        v = self.get(key)
        if v is None:
            raise KeyError(key)
        return v

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self.get(key) is not None

    def __bool__(self) -> bool:
        return any(bits for bits, _ in self.writes)

    def __iter__(self) -> Iterator[str]:
        return iter(self._built())

    def __len__(self) -> int:
        return len(self._built())

    def keys(self) -> KeysView[str]:
        return self._built().keys()

    def values(self) -> ValuesView[int]:
        return self._built().values()

    def items(self) -> ItemsView[str, int]:
        return self._built().items()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, RoutedMatch):
            other = other._built()
        return self._built() == other

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"RoutedMatch({self._built()!r})"

    def longest(self) -> tuple[str, int] | None:
        """The first instance (in the mapping's order) with the greatest length, and that
        length; None when empty. Read from the masks, without building the dict."""
        if self._dict is not None:
            return _first_longest(self._dict)
        writes = self.writes
        later = best = top = 0  # top: the slots whose final length is ``best``
        for bits, n in reversed(writes):
            final = bits & ~later  # the slots this write's length stays with
            later |= bits
            if final:
                if n > best:
                    best, top = n, final
                elif n == best:
                    top |= final
        seen = 0
        for bits, _ in writes:
            hit = bits & ~seen & top  # the slots this write puts first in the order
            if hit:
                return self.slots.iids[(hit & -hit).bit_length() - 1], best
            seen |= bits
        return None


def _first_longest(d: Mapping[str, int]) -> tuple[str, int] | None:
    if not d:
        return None
    lengths = list(d.values())
    top = max(lengths)
    return list(d)[lengths.index(top)], top


# _BYTE_BITS[i][v]: the positions of the set bits of byte value v at byte i of a mask
_BYTE_BITS: list[tuple[tuple[int, ...], ...]] = []
_BITS_OF = tuple(tuple(b for b in range(8) if v >> b & 1) for v in range(256))


def _byte_bits(n: int) -> list[tuple[tuple[int, ...], ...]]:
    """:data:`_BYTE_BITS` for the first ``n`` bytes (made on first need: 256 small tuples
    per byte, about 6 MB for a thousand instances' slots)."""
    while len(_BYTE_BITS) < n:
        base = 8 * len(_BYTE_BITS)
        _BYTE_BITS.append(tuple(tuple(base + b for b in bits) for bits in _BITS_OF))
    return _BYTE_BITS


def set_bits(x: int) -> list[int]:
    """The positions of the set bits of ``x`` >= 0, lowest first (a few: one at a time; many:
    each byte's from a table, in C)."""
    if x.bit_count() <= 24:
        out: list[int] = []
        while x:
            low = x & -x
            out.append(low.bit_length() - 1)
            x ^= low
        return out
    n = (x.bit_length() + 7) // 8
    return list(chain.from_iterable(map(getitem, _byte_bits(n), x.to_bytes(n, "little"))))
