"""A fake Kubernetes API server for the kubernetes driver's tests. No real API server runs
on our machines: this in-process aiohttp server implements exactly the endpoints the driver
uses, and records every call (method, path, JSON body):

- ``GET``/``PATCH`` ``/apis/workloads.x-k8s.io/v1alpha2/namespaces/{ns}/
  rolebasedgroupscalingadapters/{name}/scale`` and ``/apis/apps/v1/namespaces/{ns}/
  {deployments|statefulsets}/{name}/scale`` (merge patch of ``spec.replicas``);
- ``GET /api/v1/namespaces/{ns}/pods?labelSelector=...`` (list) and the same with
  ``watch=true&resourceVersion=N`` (newline-delimited events after N, held open until
  ``timeoutSeconds`` or the server stops);
- ``PATCH /api/v1/namespaces/{ns}/pods/{name}`` (merge patch of annotations).

A scale change plays the controller: more replicas create Pending pods (``make_ready`` turns
one Running and Ready); fewer delete the pods with the lowest
``controller.kubernetes.io/pod-deletion-cost`` (ReplicaSet behaviour; a StatefulSet deletes
the highest ordinals). ``GET /metrics`` answers an idle engine, so pods' endpoints
(``podIP`` 127.0.0.1, the server's port) can be drained. ``fail`` makes a path answer an
error status once.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

__all__ = ["Call", "FakeKube"]

COST = "controller.kubernetes.io/pod-deletion-cost"


@dataclass(frozen=True)
class Call:
    method: str
    path: str
    body: Any = None


@dataclass
class _Scaled:
    kind: str  # "adapter" | "deployments" | "statefulsets"
    name: str
    replicas: int
    selector: str
    next_ordinal: int = 0


@dataclass
class FakeKube:
    namespace: str = "default"
    calls: list[Call] = field(default_factory=list)
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    scaled: dict[tuple[str, str], _Scaled] = field(default_factory=dict)
    fail: dict[tuple[str, str], tuple[int, str]] = field(default_factory=dict)
    port: int = 0
    _version: int = 1
    _log: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    _changed: asyncio.Condition = field(default_factory=asyncio.Condition)

    # -- setup and controls ----------------------------------------------------------------

    def add_scaled(self, kind: str, name: str, replicas: int = 0) -> None:
        selector = f"app={name}"
        self.scaled[(kind, name)] = _Scaled(kind, name, 0, selector)
        self._set_replicas(self.scaled[(kind, name)], replicas)

    def make_ready(self, name: str) -> None:
        pod = self.pods[name]
        pod["status"] = {
            "phase": "Running",
            "podIP": "127.0.0.1",
            "conditions": [
                {"type": "PodScheduled", "status": "True"},
                {"type": "Ready", "status": "True", "lastTransitionTime": _now()},
            ],
            "containerStatuses": [{"name": "engine", "ready": True, "restartCount": 0,
                                   "image": "engine:latest", "imageID": "sha256:0",
                                   "state": {"running": {}}}],
        }  # fmt: skip
        self._emit("MODIFIED", pod)

    def make_unschedulable(self, name: str, created: str) -> None:
        pod = self.pods[name]
        pod["metadata"]["creationTimestamp"] = created
        pod["status"] = {
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                            "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."}],
        }  # fmt: skip
        self._emit("MODIFIED", pod)

    def names(self, kind: str, name: str) -> list[str]:
        sel = self.scaled[(kind, name)].selector.split("=", 1)[1]
        return sorted(n for n, p in self.pods.items() if p["metadata"]["labels"]["app"] == sel)

    # -- the controller --------------------------------------------------------------------

    def _emit(self, kind: str, pod: dict[str, Any]) -> None:
        self._version += 1
        pod["metadata"]["resourceVersion"] = str(self._version)
        self._log.append((self._version, {"type": kind, "object": json.loads(json.dumps(pod))}))

        async def wake() -> None:
            async with self._changed:
                self._changed.notify_all()

        asyncio.get_event_loop().create_task(wake())

    def _set_replicas(self, s: _Scaled, n: int) -> None:
        s.replicas = n
        mine = self.names(s.kind, s.name)
        for _ in range(n - len(mine)):
            name = f"{s.name}-{s.next_ordinal}"
            s.next_ordinal += 1
            self.pods[name] = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "namespace": self.namespace,
                             "labels": {"app": s.name}, "annotations": {},
                             "creationTimestamp": _now()},
                "spec": {"containers": [{"name": "engine", "image": "engine:latest"}]},
                "status": {"phase": "Pending"},
            }  # fmt: skip
            self._emit("ADDED", self.pods[name])
        extra = len(mine) - n
        if extra > 0:
            if s.kind == "statefulsets":
                order = sorted(mine, key=lambda p: int(p.rsplit("-", 1)[1]), reverse=True)
            else:
                order = sorted(mine, key=lambda p: int(
                    self.pods[p]["metadata"]["annotations"].get(COST, "0")))  # fmt: skip
            for name in order[:extra]:
                self._emit("DELETED", self.pods.pop(name))

    # -- HTTP ------------------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application()
        r = app.router
        base = "/apis/workloads.x-k8s.io/v1alpha2/namespaces/{ns}/rolebasedgroupscalingadapters"
        r.add_route("*", base + "/{name}/scale", self._adapter_scale)
        r.add_route("*", "/apis/apps/v1/namespaces/{ns}/{kind}/{name}/scale", self._apps_scale)
        r.add_get("/api/v1/namespaces/{ns}/pods", self._pods)
        r.add_patch("/api/v1/namespaces/{ns}/pods/{name}", self._patch_pod)
        r.add_get("/metrics", self._metrics)
        return app

    async def _record(self, req: web.Request) -> tuple[Any, web.Response | None]:
        body = await req.json() if req.can_read_body else None
        self.calls.append(Call(req.method, req.path_qs, body))
        err = self.fail.pop((req.method, req.path), None)
        if err is not None:
            status, message = err
            return body, web.json_response(
                {"kind": "Status", "status": "Failure", "message": message, "code": status},
                status=status,
            )
        return body, None

    async def _adapter_scale(self, req: web.Request) -> web.Response:
        return await self._scale(req, "adapter", "workloads.x-k8s.io/v1alpha2")

    async def _apps_scale(self, req: web.Request) -> web.Response:
        return await self._scale(req, req.match_info["kind"], "autoscaling/v1")

    async def _scale(self, req: web.Request, kind: str, api_version: str) -> web.Response:
        body, err = await self._record(req)
        if err is not None:
            return err
        s = self.scaled.get((kind, req.match_info["name"]))
        if s is None:
            return web.json_response(
                {"kind": "Status", "message": f"{kind} {req.match_info['name']} not found",
                 "code": 404}, status=404)  # fmt: skip
        if req.method == "PATCH":
            if req.content_type != "application/merge-patch+json":
                return web.json_response({"message": f"bad patch {req.content_type}"}, status=415)
            self._set_replicas(s, int(body["spec"]["replicas"]))
        ready = sum(
            1 for n in self.names(kind, s.name)
            if self.pods[n]["status"].get("phase") == "Running"
        )  # fmt: skip
        return web.json_response({
            "apiVersion": api_version, "kind": "Scale",
            "metadata": {"name": s.name, "namespace": self.namespace},
            "spec": {"replicas": s.replicas},
            "status": {"replicas": len(self.names(kind, s.name)), "readyReplicas": ready,
                       "selector": s.selector},
        })  # fmt: skip

    async def _pods(self, req: web.Request) -> web.StreamResponse:
        await self._record(req)
        sel = req.query.get("labelSelector", "")
        app = sel.split("=", 1)[1] if "=" in sel else None

        def match(pod: dict[str, Any]) -> bool:
            return app is None or pod["metadata"]["labels"].get("app") == app

        if req.query.get("watch") != "true":
            items = [p for p in self.pods.values() if match(p)]
            return web.json_response({"kind": "PodList", "apiVersion": "v1", "items": items,
                                      "metadata": {"resourceVersion": str(self._version)}})  # fmt: skip
        since = int(req.query.get("resourceVersion") or 0)
        timeout = float(req.query.get("timeoutSeconds") or 30)
        out = web.StreamResponse(headers={"Content-Type": "application/json"})
        await out.prepare(req)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            for version, ev in [e for e in self._log if e[0] > since]:
                since = version
                if match(ev["object"]):
                    await out.write((json.dumps(ev) + "\n").encode())
            async with self._changed:
                try:
                    await asyncio.wait_for(self._changed.wait(), deadline - loop.time())
                except TimeoutError:
                    break
        await out.write_eof()
        return out

    async def _patch_pod(self, req: web.Request) -> web.Response:
        body, err = await self._record(req)
        if err is not None:
            return err
        pod = self.pods.get(req.match_info["name"])
        if pod is None:
            return web.json_response({"message": "pod not found", "code": 404}, status=404)
        pod["metadata"]["annotations"].update(body["metadata"]["annotations"])
        self._emit("MODIFIED", pod)
        return web.json_response(pod)

    async def _metrics(self, _req: web.Request) -> web.Response:
        return web.Response(text="sglang:num_running_reqs 0\nsglang:num_queue_reqs 0\n")


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
