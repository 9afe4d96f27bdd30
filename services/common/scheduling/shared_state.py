"""Active-active gateway replicas: what they share, as pure functions (no I/O, no clock).

Two things cross replicas (the gateway's Redis shell is :mod:`services.scheduler.feeds.shared`;
the simulator delivers the same entries as events, :mod:`services.sim.routing`):

- Routed prefixes. After every pick a replica publishes a ``RoutedPrefix`` (block hashes,
  chosen instances, the approximate-prefix plugins that took the pick); every other replica
  applies it to its own plugins through the plugin's ``on_routed`` — what a local pick
  records, entered at once (the other replica's first byte is not seen here) — so cache
  affinity survives losing the replica that routed a conversation.
  A pick that fails before its first byte is settled as not ok locally (the plugin drops
  the entries it created); a ``retracted`` entry makes every other replica do the same.
  The entry also announces the pick as a carrier (its predicted prefill and cached blocks):
  another replica's dispatch order holds a request whose prefix that pick still computes
  (:func:`apply_carrier`) until the ``answered`` entry for the pick's first byte.
- In-flight load. Each replica heartbeats a ``ReplicaInFlight`` (its own per-instance
  in-flight requests and pending prefill tokens, and its dispatch order's backlog, stamped
  with wall-clock ms); readers add the other replicas' counts whose heartbeat is younger
  than a TTL, so a dead replica's load drops out when its heartbeat expires. The backlogs
  (:func:`merge_backlog`) are counted down by the heartbeat's age: each replica's dispatch
  order then holds prompts back by the whole instance's predicted prefill queue, not only
  by the part it sent itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from tideserve.v1 import events_pb2

from services.common.admission.shaper import DispatchShaper
from services.common.routing.framework import Scheduler, Settle
from services.common.routing.plugins.prefix import ApproxPrefix
from services.common.routing.types import Choice, EndpointView, Pick, RequestView

__all__ = [
    "InFlight",
    "apply_carrier",
    "apply_routed",
    "approx_plugins",
    "dead_replicas",
    "heartbeat",
    "merge_backlog",
    "merge_in_flight",
    "pick_entry",
    "routed_entry",
    "routed_plugins",
]

InFlight = tuple[int, int]
"""(requests, pending prefill tokens) one replica has in flight on one instance."""


def approx_plugins(scheduler: Scheduler) -> dict[str, ApproxPrefix]:
    """Every approximate-prefix plugin instance of the scheduler's profiles, by name."""
    out: dict[str, ApproxPrefix] = {}
    for prof in scheduler.profiles.values():
        for hook in prof.post_pick:
            if isinstance(hook, ApproxPrefix):
                out[hook.name] = hook
    return out


def routed_plugins(scheduler: Scheduler, pick: Pick) -> list[str]:
    """Names of the approximate-prefix plugins that observed ``pick`` (the decode profile,
    plus its prefill profile when the pick is disaggregated), in first-seen order."""
    prof = scheduler.profiles.get(pick.profile)
    if prof is None:
        return []
    used = [prof]
    if pick.prefill is not None and prof.prefill_profile in scheduler.profiles:
        used.append(scheduler.profiles[prof.prefill_profile])
    names: dict[str, None] = {}
    for p in used:
        for hook in p.post_pick:
            if isinstance(hook, ApproxPrefix):
                names[hook.name] = None
    return list(names)


def routed_entry(
    request: RequestView,
    pick: Pick,
    plugins: Sequence[str],
    *,
    deployment: str,
    replica_id: str,
    ts_ms: int,
    retracted: bool = False,
    answered: bool = False,
) -> events_pb2.RoutedPrefix | None:
    """The stream entry for a local pick, or for its end: ``retracted`` (it failed before
    the first byte) or ``answered`` (its first byte came), which need no hashes; None when
    there is nothing to share (no block hashes, or no approximate-prefix plugin took the
    pick)."""
    if not request.block_hashes or not plugins:
        return None
    ids = [pick.decode.endpoint.instance_id]
    if pick.prefill is not None:
        ids.append(pick.prefill.endpoint.instance_id)
    if retracted or answered:
        return events_pb2.RoutedPrefix(
            deployment=deployment, replica_id=replica_id, instance_ids=ids, ts_ms=ts_ms,
            plugins=plugins, request_id=request.request_id, retracted=retracted,
            answered=answered and not retracted,
        )  # fmt: skip
    return events_pb2.RoutedPrefix(
        deployment=deployment,
        replica_id=replica_id,
        block_hashes=request.block_hashes,
        instance_ids=ids,
        ts_ms=ts_ms,
        plugins=plugins,
        request_id=request.request_id,
        prefill_ms=max(0.0, pick.predicted_prefill_ms),
        cached_blocks=max(0, pick.predicted_cached_tokens // max(1, request.block_size)),
    )


def pick_entry(
    scheduler: Scheduler,
    request: RequestView,
    pick: Pick,
    *,
    deployment: str,
    replica_id: str,
    ts_ms: int,
    retracted: bool = False,
    answered: bool = False,
) -> events_pb2.RoutedPrefix | None:
    """:func:`routed_entry` for a pick ``scheduler`` made, with the approximate-prefix
    plugins that took it (:func:`routed_plugins`)."""
    return routed_entry(
        request,
        pick,
        routed_plugins(scheduler, pick),
        deployment=deployment,
        replica_id=replica_id,
        ts_ms=ts_ms,
        retracted=retracted,
        answered=answered,
    )


def apply_routed(
    plugins: Mapping[str, ApproxPrefix],
    entry: events_pb2.RoutedPrefix,
    *,
    replica_id: str,
    now: float,
    wall_ms: int,
    max_age_s: float,
) -> bool:
    """Apply another replica's pick to the named local plugins at local time ``now``.

    Returns False (nothing changed) for this replica's own entries, entries without hashes
    or instances, and entries older than ``max_age_s`` by wall clock (a backlog read at
    start-up). Applying the same entry twice only refreshes its recency (idempotent for
    matching purposes). A ``retracted`` entry settles the earlier entry of the same
    (replica, request) as not ok: the plugins drop what that entry created, if they still
    remember it (unknown or already retracted: nothing happens).
    """
    if entry.replica_id == replica_id or not entry.instance_ids or entry.answered:
        return False
    if not entry.retracted and not entry.block_hashes:
        return False
    if wall_ms - entry.ts_ms > max_age_s * 1000.0:
        return False
    targets = [plugins[n] for n in entry.plugins if n in plugins]
    if not targets:
        return False
    hashes = tuple(entry.block_hashes)
    view = RequestView(
        request_id=f"routed:{entry.replica_id}:{entry.request_id or entry.ts_ms}",
        prompt_tokens=0,
        block_hashes=hashes,
    )
    ids = list(entry.instance_ids)
    pick = Pick(
        decode=Choice(EndpointView(instance_id=ids[0]), 0.0),
        prefill=Choice(EndpointView(instance_id=ids[1]), 0.0) if len(ids) > 1 else None,
        profile="",
    )
    for plugin in targets:
        if not entry.retracted:
            plugin.on_routed(now, view, pick)
        elif isinstance(plugin, Settle):
            plugin.on_settle(view, pick, False)
    return True


def apply_carrier(
    shaper: DispatchShaper,
    entry: events_pb2.RoutedPrefix,
    *,
    replica_id: str,
    now: float,
    wall_ms: int,
) -> dict[str, list[str]]:
    """Another replica's pick or its end, for this replica's dispatch order at local time
    ``now``: a pick with a predicted prefill is a carrier on the instance that computes its
    prompt (the last of ``instance_ids``), from its time by wall clock; an ``answered`` or
    ``retracted`` entry ends it. Returns, per instance, the requests to dispatch now. This
    replica's own entries and entries without a request id change nothing."""
    if entry.replica_id == replica_id or not entry.request_id or not entry.instance_ids:
        return {}
    key = f"{entry.replica_id}/{entry.request_id}"
    if entry.answered or entry.retracted:
        return shaper.foreign_end(key, now)
    if entry.prefill_ms <= 0:
        return {}
    return shaper.foreign_carrier(
        key, entry.instance_ids[-1], tuple(entry.block_hashes), entry.cached_blocks,
        entry.prefill_ms, now, age_s=max(0, wall_ms - entry.ts_ms) / 1000.0,
    )  # fmt: skip


def heartbeat(
    own: Mapping[str, InFlight],
    *,
    deployment: str,
    replica_id: str,
    ts_ms: int,
    backlog_ms: Mapping[str, float] | None = None,
) -> events_pb2.ReplicaInFlight:
    """This replica's heartbeat: its in-flight counts and (``backlog_ms``) its dispatch
    order's backlog per instance; instances with nothing of either are left out."""
    backlog = backlog_ms or {}
    ids = sorted(
        {i for i, (req, toks) in own.items() if req > 0 or toks > 0}
        | {i for i, ms in backlog.items() if ms > 0}
    )
    return events_pb2.ReplicaInFlight(
        deployment=deployment,
        replica_id=replica_id,
        ts_ms=ts_ms,
        instances=[
            events_pb2.InstanceInFlight(
                instance_id=iid,
                requests=own.get(iid, (0, 0))[0],
                pending_prefill_tokens=max(0, own.get(iid, (0, 0))[1]),
                dispatch_backlog_ms=max(0.0, backlog.get(iid, 0.0)),
            )
            for iid in ids
        ],
    )


def merge_in_flight(
    beats: Iterable[events_pb2.ReplicaInFlight],
    *,
    replica_id: str,
    now_ms: int,
    ttl_ms: int,
) -> dict[str, InFlight]:
    """Sum of the other replicas' in-flight counts per instance, from heartbeats younger
    than ``ttl_ms`` (a heartbeat from the future by clock skew counts as fresh). This
    replica's own heartbeat is skipped (its counts are already local)."""
    out: dict[str, InFlight] = {}
    for b in beats:
        if b.replica_id == replica_id or now_ms - b.ts_ms > ttl_ms:
            continue
        for i in b.instances:
            req, toks = out.get(i.instance_id, (0, 0))
            out[i.instance_id] = (
                req + max(0, i.requests),
                toks + max(0, i.pending_prefill_tokens),
            )
    return out


def merge_backlog(
    beats: Iterable[events_pb2.ReplicaInFlight],
    *,
    replica_id: str,
    now_ms: int,
    ttl_ms: int,
) -> dict[str, float]:
    """The other replicas' dispatch backlog per instance (ms) left at ``now_ms``: each
    fresh heartbeat's backlog less its age (a backlog runs down as time passes), summed;
    instances with none left are absent."""
    out: dict[str, float] = {}
    for b in beats:
        age = now_ms - b.ts_ms
        if b.replica_id == replica_id or age > ttl_ms:
            continue
        for i in b.instances:
            left = i.dispatch_backlog_ms - max(0, age)
            if left > 0:
                out[i.instance_id] = out.get(i.instance_id, 0.0) + left
    return out


def dead_replicas(
    beats: Iterable[events_pb2.ReplicaInFlight], *, now_ms: int, forget_ms: int
) -> list[str]:
    """Replicas whose last heartbeat is older than ``forget_ms`` (their hash fields may be
    deleted; much longer than the TTL so a slow replica is not erased while alive)."""
    return sorted({b.replica_id for b in beats if now_ms - b.ts_ms > forget_ms})
