"""What the model side has observed, as fit samples per deployment x role (pure: no I/O,
times are passed in).

Sample extraction (one record → at most one sample of each kind):

* prefill, on the role that computed the prompt (the prefill instance when disaggregated,
  else the decode/worker instance): ``n = prompt - cached`` uncached tokens, ``q =
  engine_pending_prefill_tokens`` (the prefill queued ahead on that engine when the router
  picked), target ``ttft_ms - queue_ms`` (the gateway's admission wait is not the
  engine's). Only OK records with a first token.
* decode, on the decode/worker role: target ``tpot_ms`` (mean inter-token time after the
  first), batch ``b = engine_running + 1`` (the batch it joined, itself included) and
  context ``c = b * (prompt + completion / 2)`` — the record does not carry the other
  sequences' contexts, so they are taken as like this one at its midpoint. Needs at least
  2 completion tokens.
* transfer (disaggregated, ``kv_transfer_ms > 0``): ``prompt * kv_bytes_per_token`` bytes,
  on the prefill role.

Instance roles come from load snapshots and membership events (records name instances,
not roles); an instance never seen defaults to prefill/decode when the record is
disaggregated, else worker. Load snapshots with a running batch and a decode throughput
give fallback decode samples ``(b = running, c = kv_usage * capacity tokens, ITL =
1000 * running / decode_tokens_per_s)``; so do ``/metrics`` scrapes (:mod:`.scrape`).
Start-up: a membership ``added`` in state STARTING, then the first READY of the same
instance and epoch; or an ``added`` READY that carries its driver's own measurement (label
``startup_ms`` > 0: the autoscaler announces an instance only once it serves).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from tideserve.v1 import common_pb2, events_pb2

from services.telemetry.model.fit import FitConfig, RoleSamples

__all__ = ["DecodeObservation", "ModelState", "RoleKey"]

RoleKey = tuple[str, int]  # (deployment, common_pb2.Role)

_W, _P, _D = common_pb2.ROLE_WORKER, common_pb2.ROLE_PREFILL, common_pb2.ROLE_DECODE
_OK = events_pb2.REQUEST_OUTCOME_OK
_STARTING = common_pb2.INSTANCE_STATE_STARTING
_READY = common_pb2.INSTANCE_STATE_READY
_GONE = (common_pb2.INSTANCE_STATE_STOPPED, common_pb2.INSTANCE_STATE_FAILED)


@dataclass(frozen=True)
class DecodeObservation:
    """A decode sample from an engine's own figures (snapshot or scrape)."""

    deployment: str
    instance_id: str
    batch: float
    context_tokens: float
    itl_ms: float


class ModelState:
    """Samples per deployment x role, instance roles and pending start-ups."""

    def __init__(self, cfg: FitConfig, kv_bytes_per_token: int, block_size: int) -> None:
        self.cfg = cfg
        self.kv_bytes_per_token = kv_bytes_per_token
        self.block_size = block_size
        self.samples: dict[RoleKey, RoleSamples] = {}
        self.roles: dict[tuple[str, str], int] = {}  # (deployment, instance) -> role
        self._starting: dict[tuple[str, str], tuple[int, int]] = {}  # -> (epoch, added ms)
        self.rejected = 0

    def _of(self, deployment: str, role: int) -> RoleSamples:
        key = (deployment, role)
        s = self.samples.get(key)
        if s is None:
            s = self.samples[key] = RoleSamples(self.cfg.max_samples)
        return s

    def deployments(self) -> set[str]:
        return {d for d, _ in self.samples} | {d for d, _ in self.roles}

    def role_of(self, deployment: str, instance: str, default: int) -> int:
        return self.roles.get((deployment, instance), default)

    def observe_records(self, records: Iterable[events_pb2.RequestRecord]) -> None:
        for r in records:
            self.observe_record(r)

    def observe_record(self, r: events_pb2.RequestRecord) -> None:
        if r.outcome != _OK or r.ttft_ms <= 0 or not r.deployment:
            self.rejected += 1
            return
        dep = r.deployment
        dis = r.disaggregated and bool(r.prefill_instance)
        p_inst = r.prefill_instance if dis else r.decode_instance
        p_role = self.role_of(dep, p_inst, _P if dis else _W)
        d_role = self.role_of(dep, r.decode_instance, _D if dis else _W)
        n = max(0, r.prompt_tokens - r.cached_tokens)
        target = r.ttft_ms - max(0.0, r.queue_ms)
        if target > 0:
            q = max(0, r.engine_pending_prefill_tokens)
            self._of(dep, p_role).prefill.append((float(n), float(q), target))
        if r.completion_tokens >= 2 and r.tpot_ms > 0:
            b = max(0, r.engine_running) + 1
            c = b * (r.prompt_tokens + r.completion_tokens / 2.0)
            self._of(dep, d_role).decode.append((float(b), c, r.tpot_ms))
        if dis and r.kv_transfer_ms > 0 and r.prompt_tokens > 0:
            nbytes = float(r.prompt_tokens * self.kv_bytes_per_token)
            self._of(dep, p_role).transfer.append((nbytes, r.kv_transfer_ms))

    def observe_snapshot(self, s: events_pb2.LoadSnapshot) -> None:
        if not s.deployment or not s.instance_id:
            return
        if s.role:
            self.roles[(s.deployment, s.instance_id)] = s.role
        if s.num_running > 0 and s.decode_tokens_per_s > 0:
            ctx = max(0.0, s.kv_usage) * s.kv_capacity_blocks * self.block_size
            itl = 1000.0 * s.num_running / s.decode_tokens_per_s
            self.observe_decode(
                DecodeObservation(s.deployment, s.instance_id, s.num_running, ctx, itl)
            )

    def observe_decode(self, o: DecodeObservation) -> None:
        """A fallback decode sample (see the module docstring)."""
        if o.batch <= 0 or o.itl_ms <= 0:
            return
        role = self.role_of(o.deployment, o.instance_id, _W)
        self._of(o.deployment, role).decode_fallback.append((o.batch, o.context_tokens, o.itl_ms))

    def observe_membership(self, e: events_pb2.MembershipEvent) -> None:
        inst = e.instance
        if not inst.deployment or not inst.instance_id:
            return
        key = (inst.deployment, inst.instance_id)
        if inst.role:
            self.roles[key] = inst.role
        kind = e.kind
        if kind == events_pb2.MembershipEvent.KIND_REMOVED or inst.state in _GONE:
            self._starting.pop(key, None)
            return
        if kind == events_pb2.MembershipEvent.KIND_ADDED and inst.state == _STARTING:
            self._starting[key] = (inst.epoch, e.ts_ms)
            return
        if inst.state == _READY and key in self._starting:
            epoch, added = self._starting.pop(key)
            if epoch == inst.epoch and e.ts_ms >= added:
                role = inst.role or _W
                self._of(inst.deployment, role).startup.append((e.ts_ms - added) / 1000.0)
        elif inst.state == _READY and kind == events_pb2.MembershipEvent.KIND_ADDED:
            measured = _float(inst.labels.get("startup_ms", ""))
            if measured > 0:
                self._of(inst.deployment, inst.role or _W).startup.append(measured / 1000.0)


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return 0.0
