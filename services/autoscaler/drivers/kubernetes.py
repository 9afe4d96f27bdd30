"""The ``kubernetes`` driver: scale a role through the API server, with the official client
(``kubernetes.aio``, asyncio-native).

What a role scales (``KubernetesSettings.target``):

- ``adapter``: the role's ``RoleBasedGroupScalingAdapter`` (``workloads.x-k8s.io/v1alpha2``,
  plural ``rolebasedgroupscalingadapters``, named ``<group>-<role>``), through its ``scale``
  subresource (``spec.replicas``; the pods are found by ``status.selector``);
- ``deployment`` / ``statefulset``: ``<deployment>-<role>`` in ``apps/v1``, through its
  ``scale`` subresource.

Pods: listed once per role by the scale's selector, then watched (``watch=true`` from the
list's ``resourceVersion``; re-listed after an error or a 410). A pod is STARTING while
Pending or not Ready (a pod Pending longer than ``pending_timeout_s`` carries the reason in
``last_error``: "stuck Pending 130s: Unschedulable: 0/3 nodes ..."), READY when its Ready
condition is True (``ready_ms`` = that transition), FAILED in phase Failed or a container in
CrashLoopBackOff, DRAINING once we drain it or it is terminating, STOPPED when deleted.
Endpoint: ``http://<podIP>:<engine_port>``.

Scale-out patches ``spec.replicas`` up and returns. Scale-in, for each victim (the caller's,
else :func:`~.base.choose_victims`; for a StatefulSet always the highest ordinals, which is
what its controller removes): DRAINING is announced, the scheduler drains it
(:class:`~.drain.Drainer`), its agent sessions are migrated (with kvmeta configured), the
pod is annotated ``controller.kubernetes.io/pod-deletion-cost:
"-1000"`` so the ReplicaSet deletes exactly it, and only then is ``spec.replicas`` lowered.
A scale-in that fails after draining (an API error) leaves its victims DRAINING: the retry
takes them first; a scale-out instead puts them back (READY again, announced ADDED).
API errors become :class:`~.base.DriverError` naming the call, status and message.

The API calls, all namespaced: get/patch ``<target>/scale``, list/watch ``pods``, patch
``pods`` (the annotation); see deploy/k8s/rbac/autoscaler.yaml.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

import aiohttp
from kubernetes.aio import client as kclient
from kubernetes.aio import config as kconfig
from kubernetes.aio.client.exceptions import ApiException

from services.autoscaler.drivers.drain import Drainer
from services.autoscaler.drivers.sessions import peers_of
from services.autoscaler.drivers.settings import KubernetesSettings
from services.common.planner.driver_base import (
    DriverError,
    InstanceState,
    InstanceStatus,
    Listener,
    RoleTarget,
    backoff_s,
    choose_victims,
    counted,
)

__all__ = [
    "ADAPTER_GROUP",
    "ADAPTER_PLURAL",
    "ADAPTER_VERSION",
    "DELETION_COST",
    "KubernetesDriver",
    "pod_status",
    "target_name",
]

log = logging.getLogger(__name__)

ADAPTER_GROUP = "workloads.x-k8s.io"
ADAPTER_VERSION = "v1alpha2"
ADAPTER_PLURAL = "rolebasedgroupscalingadapters"
DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
VICTIM_COST = "-1000"
MERGE_PATCH = "application/merge-patch+json"
_ORDINAL = re.compile(r"-(\d+)$")


def target_name(settings: KubernetesSettings, role: RoleTarget) -> str:
    """The scaled object's name: ``<group>-<role>`` for an adapter (group defaults to the
    deployment's name), ``<deployment>-<role>`` for a Deployment/StatefulSet."""
    if settings.target == "adapter":
        return f"{settings.group_name or role.deployment}-{role.name}"
    return f"{role.deployment}-{role.name}"


def _ms(ts: str | None) -> int:
    if not ts:
        return 0
    return int(datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp() * 1000)


def _condition(pod: Mapping[str, Any], kind: str) -> Mapping[str, Any]:
    for c in pod.get("status", {}).get("conditions") or []:
        if c.get("type") == kind:
            return dict(c)
    return {}


def pod_status(
    pod: Mapping[str, Any],
    role: RoleTarget,
    *,
    port: int,
    now_ms: int,
    pending_timeout_s: float,
    draining: bool = False,
) -> InstanceStatus:
    """One pod (API JSON) as an :class:`InstanceStatus` (pure); see the module docstring."""
    meta, st = pod.get("metadata", {}), pod.get("status", {})
    phase = st.get("phase", "Pending")
    containers = st.get("containerStatuses") or []
    restarts = sum(int(c.get("restartCount", 0)) for c in containers)
    ready = _condition(pod, "Ready")
    state, error = InstanceState.STARTING, ""
    crash = next(
        (
            c["state"]["waiting"]
            for c in containers
            if (c.get("state") or {}).get("waiting", {}).get("reason") == "CrashLoopBackOff"
        ),
        None,
    )
    if meta.get("deletionTimestamp") or draining:
        state = InstanceState.DRAINING
    elif phase == "Succeeded":
        state = InstanceState.STOPPED
    elif phase == "Failed" or crash is not None:
        state = InstanceState.FAILED
        error = (
            f"CrashLoopBackOff: {crash.get('message', '')}".strip()
            if crash
            else (f"pod failed: {st.get('reason', '')} {st.get('message', '')}".strip())
        )
    elif phase == "Running" and ready.get("status") == "True":
        state = InstanceState.READY
    elif phase == "Pending":
        created = _ms(meta.get("creationTimestamp"))
        age_s = (now_ms - created) / 1000 if created else 0.0
        if age_s > pending_timeout_s:
            sched = _condition(pod, "PodScheduled")
            why = ": ".join(x for x in (sched.get("reason"), sched.get("message")) if x)
            error = f"stuck Pending {age_s:.0f}s" + (f": {why}" if why else "")
    ip = st.get("podIP", "")
    return InstanceStatus(
        instance_id=meta.get("name", ""),
        deployment=role.deployment,
        role_name=role.name,
        role=role.role,
        state=state,
        endpoint=f"http://{ip}:{port}" if ip else "",
        started_ms=_ms(meta.get("creationTimestamp")),
        ready_ms=_ms(ready.get("lastTransitionTime")) if state == InstanceState.READY else 0,
        restarts=restarts,
        last_error=error,
        engine_kind=role.engine_kind,
    )


@dataclass(frozen=True)
class _Scale:
    replicas: int
    selector: str


@dataclass
class _RoleWatch:
    role: RoleTarget
    selector: str
    pods: dict[str, dict[str, Any]]
    statuses: dict[str, InstanceStatus]
    version: str = ""
    task: asyncio.Task[None] | None = None


class KubernetesDriver:
    """Scales roles through the Kubernetes API; see the module docstring. ``api``: a ready
    ``ApiClient`` (tests pass one pointed at their server); None = built at :meth:`start`
    from ``api_url``, else ``kubeconfig``, else in-cluster, else the default kubeconfig."""

    name = "kubernetes"

    def __init__(
        self,
        settings: KubernetesSettings,
        drainer: Drainer,
        *,
        api: kclient.ApiClient | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.drainer = drainer
        self._api = api
        self._wall = wall
        self._listener: Listener | None = None
        self._roles: dict[tuple[str, str], _RoleWatch] = {}
        self._draining: set[str] = set()
        self._lock = asyncio.Lock()

    def set_listener(self, listener: Listener) -> None:
        self._listener = listener

    async def start(self) -> None:
        if self._api is not None:
            return
        cfg = kclient.Configuration()
        s = self.settings
        if s.api_url:
            cfg.host = s.api_url
        elif s.kubeconfig:
            await kconfig.load_kube_config(config_file=s.kubeconfig, client_configuration=cfg)  # type: ignore[no-untyped-call]
        else:
            try:
                kconfig.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
            except kconfig.ConfigException:
                await kconfig.load_kube_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
        self._api = kclient.ApiClient(cfg)

    def _client(self) -> kclient.ApiClient:
        if self._api is None:
            raise DriverError("kubernetes driver not started")
        return self._api

    def instances(self, deployment: str) -> Sequence[InstanceStatus]:
        return [
            st
            for (dep, _), w in self._roles.items()
            if dep == deployment
            for st in w.statuses.values()
            if st.state != InstanceState.STOPPED
        ]

    # -- API calls -----------------------------------------------------------------------

    async def _call(self, what: str, coro: Any) -> Any:
        try:
            return await coro
        except ApiException as e:
            raise DriverError(f"kubernetes {what}: {e.status} {e.reason}: {_message(e)}") from e
        except (aiohttp.ClientError, OSError, TimeoutError) as e:
            raise DriverError(f"kubernetes {what}: API server unreachable: {e}") from e

    async def _get_scale(self, role: RoleTarget) -> _Scale:
        name, ns = target_name(self.settings, role), self.settings.namespace
        what = f"get {self.settings.target} {ns}/{name} scale"
        if self.settings.target == "adapter":
            api = kclient.CustomObjectsApi(self._client())
            obj = await self._call(what, api.get_namespaced_custom_object_scale(
                ADAPTER_GROUP, ADAPTER_VERSION, ns, ADAPTER_PLURAL, name))  # fmt: skip
            spec, status = obj.get("spec") or {}, obj.get("status") or {}
            return _Scale(int(spec.get("replicas") or 0), str(status.get("selector") or ""))
        apps = kclient.AppsV1Api(self._client())
        read = (
            apps.read_namespaced_deployment_scale
            if self.settings.target == "deployment"
            else apps.read_namespaced_stateful_set_scale
        )
        scale = await self._call(what, read(name, ns))
        return _Scale(int(scale.spec.replicas or 0), str(scale.status.selector or ""))

    async def _set_scale(self, role: RoleTarget, replicas: int) -> None:
        name, ns = target_name(self.settings, role), self.settings.namespace
        what = f"patch {self.settings.target} {ns}/{name} scale to {replicas}"
        body = {"spec": {"replicas": replicas}}
        if self.settings.target == "adapter":
            api = kclient.CustomObjectsApi(self._client())
            await self._call(what, api.patch_namespaced_custom_object_scale(
                ADAPTER_GROUP, ADAPTER_VERSION, ns, ADAPTER_PLURAL, name, body,
                _content_type=MERGE_PATCH))  # fmt: skip
            return
        apps = kclient.AppsV1Api(self._client())
        patch = (
            apps.patch_namespaced_deployment_scale
            if self.settings.target == "deployment"
            else apps.patch_namespaced_stateful_set_scale
        )
        await self._call(what, patch(name, ns, body, _content_type=MERGE_PATCH))

    async def _annotate(self, pod: str, cost: str) -> None:
        ns = self.settings.namespace
        core = kclient.CoreV1Api(self._client())
        body = {"metadata": {"annotations": {DELETION_COST: cost}}}
        await self._call(
            f"annotate pod {ns}/{pod}",
            core.patch_namespaced_pod(pod, ns, body, _content_type=MERGE_PATCH),
        )

    async def _list_pods(self, selector: str) -> tuple[list[dict[str, Any]], str]:
        core = kclient.CoreV1Api(self._client())
        ns = self.settings.namespace
        what = f"list pods {ns} {selector!r}"
        resp = await self._call(
            what, core.list_namespaced_pod_without_preload_content(ns, label_selector=selector)
        )
        async with resp:
            body = await resp.read()
            if resp.status != 200:
                raise DriverError(f"kubernetes {what}: {resp.status} {body[:200]!r}")
        data = json.loads(body)
        return list(data.get("items") or []), str(data["metadata"].get("resourceVersion", ""))

    # -- pods ----------------------------------------------------------------------------

    async def _ensure_watch(self, role: RoleTarget, selector: str) -> _RoleWatch:
        key = (role.deployment, role.name)
        w = self._roles.get(key)
        if w is not None and w.selector == selector:
            w.role = role
            return w
        if w is not None and w.task is not None:
            w.task.cancel()
        if not selector:
            raise DriverError(f"role {role.name}: its scale has no status.selector to find pods")
        items, version = await self._list_pods(selector)
        w = self._roles[key] = _RoleWatch(role, selector, {}, {}, version)
        for pod in items:
            await self._update(w, pod)
        w.task = asyncio.create_task(self._watch(w), name=f"k8s-watch-{role.name}")
        return w

    async def _update(self, w: _RoleWatch, pod: dict[str, Any], deleted: bool = False) -> None:
        name = pod["metadata"]["name"]
        before = w.statuses.get(name)
        if deleted:
            w.pods.pop(name, None)
            self._draining.discard(name)
            if before is None:
                return
            status = replace(before, state=InstanceState.STOPPED)
            w.statuses.pop(name, None)
            await self._notify(status, "pod deleted")
            return
        w.pods[name] = pod
        status = pod_status(
            pod,
            w.role,
            port=self.settings.engine_port,
            now_ms=int(self._wall() * 1000),
            pending_timeout_s=self.settings.pending_timeout_s,
            draining=name in self._draining,
        )
        w.statuses[name] = status
        if before is None or (before.state, before.last_error) != (status.state, status.last_error):
            await self._notify(status, status.last_error or f"pod {status.state.value}")

    async def _notify(self, status: InstanceStatus, reason: str) -> None:
        if self._listener is None:
            return
        try:
            await self._listener(status, reason)
        except Exception:
            log.exception("kubernetes driver: listener failed for %s", status.instance_id)

    async def _watch(self, w: _RoleWatch) -> None:
        """Follow pod events from ``w.version``; re-list after an error (back-off)."""
        failures = 0
        core = kclient.CoreV1Api(self._client())
        ns = self.settings.namespace
        while True:
            try:
                if not w.version:
                    items, w.version = await self._list_pods(w.selector)
                    for gone in set(w.pods) - {p["metadata"]["name"] for p in items}:
                        await self._update(w, w.pods[gone], deleted=True)
                    for pod in items:
                        await self._update(w, pod)
                resp = await core.list_namespaced_pod_without_preload_content(
                    ns, label_selector=w.selector, watch=True, resource_version=w.version,
                    timeout_seconds=self.settings.watch_timeout_s,
                )  # fmt: skip
                async with resp:
                    if resp.status != 200:
                        raise DriverError(f"watch pods: {resp.status}")
                    while line := await resp.content.readline():
                        await self._event(w, json.loads(line))
                failures = 0
            except asyncio.CancelledError:
                raise
            except _Gone:
                w.version = ""  # too old: list again
            except Exception as e:
                failures += 1
                delay = backoff_s(failures, 0.5, 30.0)
                log.warning("kubernetes: watching pods %r failed (%s); again in %.1fs",
                            w.selector, e, delay)  # fmt: skip
                w.version = ""
                await asyncio.sleep(delay)

    async def _event(self, w: _RoleWatch, ev: Mapping[str, Any]) -> None:
        kind, obj = ev.get("type"), ev.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise _Gone
            raise DriverError(f"watch error: {obj.get('message', obj)}")
        version = (obj.get("metadata") or {}).get("resourceVersion")
        if version:
            w.version = str(version)
        if kind in ("ADDED", "MODIFIED"):
            await self._update(w, dict(obj))
        elif kind == "DELETED":
            await self._update(w, dict(obj), deleted=True)

    # -- scale ---------------------------------------------------------------------------

    async def scale(self, role: RoleTarget, replicas: int, victims: Sequence[str] = ()) -> None:
        if replicas < 0:
            raise DriverError(f"role {role.name}: replicas {replicas} is negative")
        async with self._lock:
            current = await self._get_scale(role)
            w = await self._ensure_watch(role, current.selector)
            # drained earlier by a scale-in that failed before lowering replicas
            leftover = sorted(n for n in w.pods if n in self._draining)
            if replicas >= current.replicas:
                for name in leftover:  # kept after all: serving again (ADDED)
                    self._draining.discard(name)
                    await self._update(w, w.pods[name])
                if replicas > current.replicas:
                    await self._set_scale(role, replicas)
                return
            have = [
                s for s in counted(list(w.statuses.values()), role.name)
                if s.instance_id not in self._draining
            ]  # fmt: skip
            n = current.replicas - replicas
            doomed = leftover[:n]
            if self.settings.target == "statefulset":
                by_ordinal = sorted((s.instance_id for s in have), key=_ordinal, reverse=True)
                doomed += by_ordinal[: n - len(doomed)]
            else:
                doomed += choose_victims(have, n - len(doomed), victims)
            for name in doomed:
                self._draining.add(name)
                await self._update(w, w.pods[name])  # now DRAINING, announced
        results = await asyncio.gather(
            *(self.drainer.drain(v, w.statuses[v].endpoint, role.drain_limit_s) for v in doomed)
        )
        for name, res in zip(doomed, results, strict=True):
            if not res.drained:
                log.warning("%s: %d in flight after %.1fs of draining; removing anyway",
                            name, res.in_flight, res.waited_s)  # fmt: skip
        stay = [s for n, s in w.statuses.items() if n not in self._draining]
        gone = [w.statuses[v] for v in doomed if v in w.statuses]
        await asyncio.gather(*(self.drainer.migrate(v, peers_of(v, stay)) for v in gone))
        async with self._lock:
            for name in doomed:
                await self._annotate(name, VICTIM_COST)
            await self._set_scale(role, replicas)

    async def close(self) -> None:
        for w in self._roles.values():
            if w.task is not None:
                w.task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await w.task
        self._roles.clear()
        await self.drainer.close()
        if self._api is not None:
            await self._api.close()  # type: ignore[no-untyped-call]
            self._api = None


class _Gone(Exception):
    """The watch's resourceVersion is too old (410): list again."""


def _ordinal(name: str) -> int:
    m = _ORDINAL.search(name)
    return int(m.group(1)) if m else -1


def _message(e: ApiException) -> str:
    try:
        return str(json.loads(e.body or "{}").get("message", "")) or str(e.body or "")[:200]
    except (ValueError, AttributeError):
        return str(e.body or "")[:200]
