"""Immutable inputs and outputs of a scheduling cycle (pure data, no I/O).

The shell builds an :class:`EndpointSnapshot` from load snapshots, membership and its own
in-flight reservations, and a :class:`RequestView` from the incoming request (tokenized with
``services.common.tokens``, plus the kvmeta ``MatchPrefix`` answer when a precise-prefix plugin
is configured). The core returns a :class:`Decision`: :class:`Pick`, :class:`Shed` or
:class:`NoEndpoint`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from types import MappingProxyType
from typing import Literal

from services.common.tokens.hashing import DEFAULT_BLOCK_SIZE

Role = Literal["worker", "prefill", "decode"]
Circuit = Literal["closed", "open", "half-open"]
Tier = Literal["gpu", "cpu", "ssd", "remote"]

ROLES: tuple[Role, ...] = ("worker", "prefill", "decode")
TIERS: tuple[Tier, ...] = ("gpu", "cpu", "ssd", "remote")

_EMPTY: Mapping[str, str] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class EndpointView:
    """One engine instance as the scheduler sees it at the start of a cycle.

    Load fields come from the engine's last load snapshot; ``reserved_*`` are this gateway's
    own picks that the engine has not reported yet (added by the shell, never by plugins).
    """

    instance_id: str
    url: str = ""
    role: Role = "worker"
    running: int = 0
    waiting: int = 0
    tokens_in_flight: int = 0
    pending_prefill_tokens: int = 0
    kv_usage: float = 0.0
    # KV capacity in tokens (0: not reported); with kv_usage, the room for new requests
    kv_capacity_tokens: int = 0
    prefill_tokens_per_s: float = 0.0
    healthy: bool = True
    draining: bool = False
    circuit: Circuit = "closed"
    reserved_requests: int = 0
    reserved_tokens: int = 0
    bootstrap_host: str = ""
    bootstrap_port: int = 0
    labels: Mapping[str, str] = field(default_factory=lambda: _EMPTY)

    @property
    def queue_load(self) -> int:
        """Requests on the instance: running + waiting + this gateway's unreported picks."""
        return self.running + self.waiting + self.reserved_requests

    @property
    def pending_prefill(self) -> int:
        """Prefill tokens queued ahead of a new request (engine-reported + reserved)."""
        return self.pending_prefill_tokens + self.reserved_tokens

    @property
    def kv_free_tokens(self) -> int | None:
        """KV tokens not held by running requests (idle cached blocks count as free);
        None when the capacity is not reported."""
        if self.kv_capacity_tokens <= 0:
            return None
        return int(self.kv_capacity_tokens * (1.0 - min(1.0, max(0.0, self.kv_usage))))

    @property
    def eligible(self) -> bool:
        """Healthy, not draining and circuit not open (half-open lets probes through)."""
        return self.healthy and not self.draining and self.circuit != "open"


def _iid(e: EndpointView) -> str:
    return e.instance_id


def _pick(items: tuple[EndpointView, ...], idx: tuple[int, ...]) -> tuple[EndpointView, ...]:
    if len(idx) > 1:
        return itemgetter(*idx)(items)  # type: ignore[no-any-return]
    return (items[idx[0]],) if idx else ()


class EndpointSnapshot:
    """An immutable, id-ordered set of endpoints. Iteration order is by instance id."""

    __slots__ = ("_by_id", "_items", "_pool_idx", "_pools", "_pos", "_roles", "patched", "version")

    def __init__(
        self,
        endpoints: tuple[EndpointView, ...] | list[EndpointView],
        version: int = 0,
        *,
        presorted: bool = False,
    ):
        """``presorted``: the caller guarantees ``endpoints`` is ordered by instance id
        (skips the sort; duplicates are still refused with ValueError)."""
        items = tuple(endpoints) if presorted else tuple(sorted(endpoints, key=_iid))
        by_id = {e.instance_id: e for e in items}
        if len(by_id) != len(items):
            raise ValueError("duplicate instance_id in endpoint snapshot")
        self._items = items
        self._by_id: Mapping[str, EndpointView] | None = MappingProxyType(by_id)
        self._pools: tuple[int, tuple[EndpointView, ...], tuple[EndpointView, ...]] | None = None
        # (eligible count, item indexes of the decode pool, of the prefill pool)
        self._pool_idx: tuple[int, tuple[int, ...], tuple[int, ...]] | None = None
        self._pos: dict[str, int] | None = None
        self._roles: frozenset[str] | None = None
        # made by ``replaced``: (id of the snapshot it patched, the positions it replaced),
        # for a caller following snapshots that holds the one patched (so the id is its own)
        self.patched: tuple[int, tuple[int, ...]] | None = None
        self.version = version

    def pools(self) -> tuple[int, tuple[EndpointView, ...], tuple[EndpointView, ...]]:
        """(number of eligible endpoints, eligible decode/worker endpoints, eligible
        prefill endpoints), id-ordered; computed once per snapshot."""
        p = self._pools
        if p is None:
            idx = self._indexes()
            items = self._items
            p = self._pools = (idx[0], _pick(items, idx[1]), _pick(items, idx[2]))
        return p

    def pool_sizes(self) -> tuple[int, int, int]:
        """The sizes of :meth:`pools` (eligible, decode/worker, prefill) without building
        its tuples of endpoints; computed once per snapshot."""
        n, decode, prefill = self._indexes()
        return n, len(decode), len(prefill)

    def roles(self) -> frozenset[str]:
        """The roles of the endpoints (eligible or not); computed once per snapshot and
        carried over by :meth:`replaced` when no role changed."""
        r = self._roles
        if r is None:
            r = self._roles = frozenset(e.role for e in self._items)
        return r

    def _indexes(self) -> tuple[int, tuple[int, ...], tuple[int, ...]]:
        """(eligible count, item indexes of the decode pool, of the prefill pool)."""
        idx = self._pool_idx
        if idx is None:
            items = self._items
            eligible = [i for i, e in enumerate(items) if e.eligible]
            idx = self._pool_idx = (
                len(eligible),
                tuple(i for i in eligible if items[i].role != "prefill"),
                tuple(i for i in eligible if items[i].role == "prefill"),
            )
        return idx

    def replaced(self, views: Iterable[EndpointView], version: int) -> EndpointSnapshot:
        """This snapshot with ``views`` replacing the endpoints of the same ids (ids not
        in it are ignored); cheaper than building a new one for a few changed views."""
        pos = self._pos
        if pos is None:
            pos = self._pos = {e.instance_id: i for i, e in enumerate(self._items)}
        items = list(self._items)
        same_pools = True
        changed: list[int] = []
        for v in views:
            i = pos.get(v.instance_id)
            if i is None:
                continue
            old = items[i]
            if old is v:
                continue
            items[i] = v
            changed.append(i)
            if old.eligible != v.eligible or old.role != v.role:
                same_pools = False
        new = EndpointSnapshot.__new__(EndpointSnapshot)
        new._items = tuple(items)
        new._by_id = None  # by position (``_pos``, the same ids in the same order)
        new._pools = None
        new._pool_idx = self._pool_idx if same_pools else None
        new._pos = pos
        new._roles = self._roles if same_pools else None
        new.patched = (id(self), tuple(changed))
        new.version = version
        return new

    def subset(self, positions: Sequence[int]) -> EndpointSnapshot:
        """The endpoints at ``positions`` (ascending indexes into this snapshot's order), with
        this snapshot's version. Cheaper than a new snapshot of them: no sort, and when every
        endpoint here is an eligible decode/worker one, so are theirs (no eligibility pass)."""
        items = self._items
        kept = _pick(items, tuple(positions))
        new = EndpointSnapshot.__new__(EndpointSnapshot)
        new._items = kept
        new._by_id = MappingProxyType({e.instance_id: e for e in kept})
        if len(kept) != len(new._by_id):
            raise ValueError("duplicate position in subset")
        new._pools = None
        n_eligible, decode, _ = self._indexes()
        whole = n_eligible == len(items) == len(decode)
        new._pool_idx = (len(kept), tuple(range(len(kept))), ()) if whole else None
        new._pos = None
        new._roles = None
        new.patched = None
        new.version = self.version
        return new

    def __iter__(self) -> Iterator[EndpointView]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def get(self, instance_id: str) -> EndpointView | None:
        if self._by_id is None:
            assert self._pos is not None
            i = self._pos.get(instance_id)
            return None if i is None else self._items[i]
        return self._by_id.get(instance_id)

    @property
    def endpoints(self) -> tuple[EndpointView, ...]:
        return self._items


@dataclass(frozen=True, slots=True)
class PrefixMatch:
    """Blocks of the request's prefix resident on one instance, by tier (from kvmeta)."""

    matched_blocks: int
    tiers: Mapping[Tier, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class RequestView:
    """What the core knows about a request. ``block_hashes`` are chained hashes of the
    prompt's full blocks (``services.common.tokens.block_hashes``, parent first).

    ``ttft_slo_ms`` is the time-to-first-token budget left for this request (0 = none),
    ``tpot_slo_ms`` its class's time-per-output-token target (0 = none).
    ``prefix_matches`` is kvmeta's ``MatchPrefix`` answer (None = not looked up).
    ``parent_session_id`` is a sub-agent's parent session: the sub-agent's prompt starts from
    the parent's system prompt and tools, so session placement considers the parent's place.
    """

    request_id: str
    prompt_tokens: int
    block_hashes: tuple[int, ...] = ()
    block_size: int = DEFAULT_BLOCK_SIZE
    max_tokens: int = 0
    tenant: str = ""
    slo_class: str = ""
    session_id: str = ""
    parent_session_id: str = ""
    lora: str = ""
    ttft_slo_ms: float = 0.0
    tpot_slo_ms: float = 0.0
    prefix_matches: Mapping[str, PrefixMatch] | None = None
    exclude: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class Choice:
    """A chosen endpoint with its combined weighted score and per-plugin (score, weight)."""

    endpoint: EndpointView
    score: float
    scores: tuple[tuple[str, float, float], ...] = ()


@dataclass(frozen=True, slots=True)
class Pick:
    """Route to ``decode`` (the aggregated worker or decode instance); when
    ``prefill`` is set the request is disaggregated (prefill there, decode on ``decode``)."""

    decode: Choice
    prefill: Choice | None
    profile: str
    predicted_cached_tokens: int = 0
    predicted_ttft_ms: float = 0.0
    # The prompt's own prefill on the target (its predicted cache counted, no queue): what
    # the dispatch order (admission.shaper) sorts by; 0 when no cost plugin predicted it.
    predicted_prefill_ms: float = 0.0

    @property
    def disaggregated(self) -> bool:
        return self.prefill is not None


@dataclass(frozen=True, slots=True)
class Shed:
    """Refuse the request now (overload / SLO infeasible); retry after ``retry_after_ms``."""

    reason: str
    retry_after_ms: int


@dataclass(frozen=True, slots=True)
class NoEndpoint:
    """No eligible endpoint (all unhealthy, draining, excluded or filtered out)."""

    reason: str


Decision = Pick | Shed | NoEndpoint
