"""Settings of the autoscaler's drivers and reconciler (the lead nests :class:`DriverSettings`
under the autoscaler's settings, e.g. ``TIDESERVE_AUTOSCALER__DRIVER__KIND=local``)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, field_validator

__all__ = ["DriverSettings", "KubernetesSettings", "LocalSettings"]


class LocalSettings(BaseModel):
    """The ``local`` driver: engine processes on this machine."""

    host: str = Field("127.0.0.1", description="address engines bind to and are reached at")
    port_min: int = Field(31000, ge=1, le=65535, description="first port handed to engines")
    port_max: int = Field(31999, ge=1, le=65535, description="last port handed to engines")
    state_dir: str = Field(
        "", description="engine logs and state (<dir>/<instance>.log); '' = a temp dir"
    )
    instance_id_format: str = Field(
        "{deployment}-{role}-{n}",
        description="instance ids: {deployment}, {role} (the role's name) and {n} (1, 2, ... "
        "per role, never reused while the driver runs); must contain {n}",
    )
    probe_interval_s: float = Field(0.25, gt=0, description="readiness/liveness poll period")
    stop_grace_s: float = Field(10.0, gt=0, description="SIGTERM -> SIGKILL grace period")
    restart_base_s: float = Field(1.0, gt=0, description="first restart back-off")
    restart_max_s: float = Field(60.0, gt=0, description="restart back-off cap")
    failures_to_surface: int = Field(
        3, ge=1, description="consecutive crashes after which the instance shows FAILED"
    )

    @field_validator("instance_id_format")
    @classmethod
    def _id_format(cls, value: str) -> str:
        try:
            one = value.format(deployment="d", role="r", n=1)
            two = value.format(deployment="d", role="r", n=2)
        except (KeyError, IndexError, ValueError) as e:
            raise ValueError(f"{value!r}: only {{deployment}}, {{role}}, {{n}} ({e})") from e
        if one == two:
            raise ValueError(f"{value!r} must contain {{n}}: ids would repeat")
        return value


class KubernetesSettings(BaseModel):
    """The ``kubernetes`` driver."""

    namespace: str = Field("default", description="namespace of the scaled objects and pods")
    target: Literal["adapter", "deployment", "statefulset"] = Field(
        "adapter",
        description="what a role scales: its RoleBasedGroupScalingAdapter (named "
        "<group>-<role>), or a Deployment/StatefulSet named <deployment>-<role>",
    )
    group_name: str = Field("", description="RoleBasedGroup name; '' = the deployment's name")
    kubeconfig: str = Field("", description="kubeconfig path; '' = in-cluster, then default")
    api_url: str = Field("", description="API server URL override (tests, proxies)")
    engine_port: int = Field(8000, ge=1, le=65535, description="engine HTTP port in pods")
    pending_timeout_s: float = Field(
        120.0, gt=0, description="a pod Pending longer than this is reported stuck"
    )
    watch_timeout_s: int = Field(60, ge=1, description="server-side timeout of one pod watch")


class DriverSettings(BaseModel):
    """Which driver runs, how scale-in drains, and how the reconciler retries."""

    kind: Literal["local", "kubernetes", "dry-run"] = Field("dry-run", description="driver")
    scheduler_addresses: list[str] = Field(
        default_factory=list,
        description="gRPC host:port of every gateway replica, for Drain; [] = engine load only",
    )
    kvmeta_address: str = Field(
        "",
        description="kvmeta gRPC host:port: a drained instance's agent sessions are migrated "
        "before removal and scale-in victims weigh their session KV; '' = neither",
    )
    drain_timeout_s: float = Field(
        60.0, gt=0, description="longest wait for in-flight requests before stopping anyway"
    )
    drain_poll_s: float = Field(0.2, gt=0, description="in-flight poll period while draining")
    retry_base_s: float = Field(1.0, gt=0, description="reconciler: first retry back-off")
    retry_max_s: float = Field(30.0, gt=0, description="reconciler: retry back-off cap")
    resync_s: float = Field(5.0, gt=0, description="reconciler: re-check period when idle")
    membership_maxlen: int = Field(100_000, gt=0, description="membership stream trim length")
    local: LocalSettings = Field(default_factory=LocalSettings)  # type: ignore[arg-type]
    kubernetes: KubernetesSettings = Field(default_factory=KubernetesSettings)  # type: ignore[arg-type]
