from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Role(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ROLE_UNSPECIFIED: _ClassVar[Role]
    ROLE_WORKER: _ClassVar[Role]
    ROLE_PREFILL: _ClassVar[Role]
    ROLE_DECODE: _ClassVar[Role]
    ROLE_KVCACHE: _ClassVar[Role]

class Tier(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TIER_UNSPECIFIED: _ClassVar[Tier]
    TIER_GPU: _ClassVar[Tier]
    TIER_CPU: _ClassVar[Tier]
    TIER_SSD: _ClassVar[Tier]
    TIER_REMOTE: _ClassVar[Tier]

class EngineKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ENGINE_KIND_UNSPECIFIED: _ClassVar[EngineKind]
    ENGINE_KIND_SIM: _ClassVar[EngineKind]
    ENGINE_KIND_SGLANG: _ClassVar[EngineKind]
    ENGINE_KIND_VLLM: _ClassVar[EngineKind]

class PDProtocol(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PD_PROTOCOL_UNSPECIFIED: _ClassVar[PDProtocol]
    PD_PROTOCOL_SGLANG_BOOTSTRAP: _ClassVar[PDProtocol]
    PD_PROTOCOL_VLLM_TWO_STEP: _ClassVar[PDProtocol]

class InstanceState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    INSTANCE_STATE_UNSPECIFIED: _ClassVar[InstanceState]
    INSTANCE_STATE_STARTING: _ClassVar[InstanceState]
    INSTANCE_STATE_READY: _ClassVar[InstanceState]
    INSTANCE_STATE_DRAINING: _ClassVar[InstanceState]
    INSTANCE_STATE_STOPPED: _ClassVar[InstanceState]
    INSTANCE_STATE_FAILED: _ClassVar[InstanceState]
ROLE_UNSPECIFIED: Role
ROLE_WORKER: Role
ROLE_PREFILL: Role
ROLE_DECODE: Role
ROLE_KVCACHE: Role
TIER_UNSPECIFIED: Tier
TIER_GPU: Tier
TIER_CPU: Tier
TIER_SSD: Tier
TIER_REMOTE: Tier
ENGINE_KIND_UNSPECIFIED: EngineKind
ENGINE_KIND_SIM: EngineKind
ENGINE_KIND_SGLANG: EngineKind
ENGINE_KIND_VLLM: EngineKind
PD_PROTOCOL_UNSPECIFIED: PDProtocol
PD_PROTOCOL_SGLANG_BOOTSTRAP: PDProtocol
PD_PROTOCOL_VLLM_TWO_STEP: PDProtocol
INSTANCE_STATE_UNSPECIFIED: InstanceState
INSTANCE_STATE_STARTING: InstanceState
INSTANCE_STATE_READY: InstanceState
INSTANCE_STATE_DRAINING: InstanceState
INSTANCE_STATE_STOPPED: InstanceState
INSTANCE_STATE_FAILED: InstanceState

class Endpoint(_message.Message):
    __slots__ = ("url", "bootstrap_host", "bootstrap_port", "transfer_address")
    URL_FIELD_NUMBER: _ClassVar[int]
    BOOTSTRAP_HOST_FIELD_NUMBER: _ClassVar[int]
    BOOTSTRAP_PORT_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    url: str
    bootstrap_host: str
    bootstrap_port: int
    transfer_address: str
    def __init__(self, url: _Optional[str] = ..., bootstrap_host: _Optional[str] = ..., bootstrap_port: _Optional[int] = ..., transfer_address: _Optional[str] = ...) -> None: ...

class Instance(_message.Message):
    __slots__ = ("instance_id", "deployment", "role", "engine_kind", "endpoint", "state", "epoch", "labels", "updated_ms")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    ENGINE_KIND_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    UPDATED_MS_FIELD_NUMBER: _ClassVar[int]
    instance_id: str
    deployment: str
    role: Role
    engine_kind: EngineKind
    endpoint: Endpoint
    state: InstanceState
    epoch: int
    labels: _containers.ScalarMap[str, str]
    updated_ms: int
    def __init__(self, instance_id: _Optional[str] = ..., deployment: _Optional[str] = ..., role: _Optional[_Union[Role, str]] = ..., engine_kind: _Optional[_Union[EngineKind, str]] = ..., endpoint: _Optional[_Union[Endpoint, _Mapping]] = ..., state: _Optional[_Union[InstanceState, str]] = ..., epoch: _Optional[int] = ..., labels: _Optional[_Mapping[str, str]] = ..., updated_ms: _Optional[int] = ...) -> None: ...

class SLOClass(_message.Message):
    __slots__ = ("name", "priority", "ttft_ms", "tpot_ms", "percentile", "max_queue_ms")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    TTFT_MS_FIELD_NUMBER: _ClassVar[int]
    TPOT_MS_FIELD_NUMBER: _ClassVar[int]
    PERCENTILE_FIELD_NUMBER: _ClassVar[int]
    MAX_QUEUE_MS_FIELD_NUMBER: _ClassVar[int]
    name: str
    priority: int
    ttft_ms: float
    tpot_ms: float
    percentile: float
    max_queue_ms: float
    def __init__(self, name: _Optional[str] = ..., priority: _Optional[int] = ..., ttft_ms: _Optional[float] = ..., tpot_ms: _Optional[float] = ..., percentile: _Optional[float] = ..., max_queue_ms: _Optional[float] = ...) -> None: ...

class Coordination(_message.Message):
    __slots__ = ("min_pd_ratio", "max_pd_ratio", "scale_together", "drain_before_remove", "drain_timeout_s", "max_skew_percent")
    MIN_PD_RATIO_FIELD_NUMBER: _ClassVar[int]
    MAX_PD_RATIO_FIELD_NUMBER: _ClassVar[int]
    SCALE_TOGETHER_FIELD_NUMBER: _ClassVar[int]
    DRAIN_BEFORE_REMOVE_FIELD_NUMBER: _ClassVar[int]
    DRAIN_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    MAX_SKEW_PERCENT_FIELD_NUMBER: _ClassVar[int]
    min_pd_ratio: float
    max_pd_ratio: float
    scale_together: _containers.RepeatedScalarFieldContainer[str]
    drain_before_remove: bool
    drain_timeout_s: float
    max_skew_percent: float
    def __init__(self, min_pd_ratio: _Optional[float] = ..., max_pd_ratio: _Optional[float] = ..., scale_together: _Optional[_Iterable[str]] = ..., drain_before_remove: _Optional[bool] = ..., drain_timeout_s: _Optional[float] = ..., max_skew_percent: _Optional[float] = ...) -> None: ...

class ReplicaBudget(_message.Message):
    __slots__ = ("max_replicas", "group", "priority")
    MAX_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    max_replicas: int
    group: str
    priority: int
    def __init__(self, max_replicas: _Optional[int] = ..., group: _Optional[str] = ..., priority: _Optional[int] = ...) -> None: ...

class RoleSpec(_message.Message):
    __slots__ = ("name", "role", "replicas", "min_replicas", "max_replicas", "engine_kind", "engine_args", "image", "resources", "dependencies", "template", "restart_policy", "ports", "sidecars", "startup_timeout_s")
    class ResourcesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    MIN_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    MAX_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    ENGINE_KIND_FIELD_NUMBER: _ClassVar[int]
    ENGINE_ARGS_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    DEPENDENCIES_FIELD_NUMBER: _ClassVar[int]
    TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    RESTART_POLICY_FIELD_NUMBER: _ClassVar[int]
    PORTS_FIELD_NUMBER: _ClassVar[int]
    SIDECARS_FIELD_NUMBER: _ClassVar[int]
    STARTUP_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    name: str
    role: Role
    replicas: int
    min_replicas: int
    max_replicas: int
    engine_kind: EngineKind
    engine_args: _containers.RepeatedScalarFieldContainer[str]
    image: str
    resources: _containers.ScalarMap[str, str]
    dependencies: _containers.RepeatedScalarFieldContainer[str]
    template: str
    restart_policy: str
    ports: _containers.RepeatedScalarFieldContainer[int]
    sidecars: _containers.RepeatedScalarFieldContainer[str]
    startup_timeout_s: float
    def __init__(self, name: _Optional[str] = ..., role: _Optional[_Union[Role, str]] = ..., replicas: _Optional[int] = ..., min_replicas: _Optional[int] = ..., max_replicas: _Optional[int] = ..., engine_kind: _Optional[_Union[EngineKind, str]] = ..., engine_args: _Optional[_Iterable[str]] = ..., image: _Optional[str] = ..., resources: _Optional[_Mapping[str, str]] = ..., dependencies: _Optional[_Iterable[str]] = ..., template: _Optional[str] = ..., restart_policy: _Optional[str] = ..., ports: _Optional[_Iterable[int]] = ..., sidecars: _Optional[_Iterable[str]] = ..., startup_timeout_s: _Optional[float] = ...) -> None: ...

class DeploymentSpec(_message.Message):
    __slots__ = ("name", "model", "roles", "coordination", "slo_classes", "pd_protocol", "scheduler_profile", "kv_block_size", "perf_profile", "generation", "budget", "planner")
    NAME_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    ROLES_FIELD_NUMBER: _ClassVar[int]
    COORDINATION_FIELD_NUMBER: _ClassVar[int]
    SLO_CLASSES_FIELD_NUMBER: _ClassVar[int]
    PD_PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    SCHEDULER_PROFILE_FIELD_NUMBER: _ClassVar[int]
    KV_BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    PERF_PROFILE_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    BUDGET_FIELD_NUMBER: _ClassVar[int]
    PLANNER_FIELD_NUMBER: _ClassVar[int]
    name: str
    model: str
    roles: _containers.RepeatedCompositeFieldContainer[RoleSpec]
    coordination: Coordination
    slo_classes: _containers.RepeatedCompositeFieldContainer[SLOClass]
    pd_protocol: PDProtocol
    scheduler_profile: str
    kv_block_size: int
    perf_profile: str
    generation: int
    budget: ReplicaBudget
    planner: PlannerOverrides
    def __init__(self, name: _Optional[str] = ..., model: _Optional[str] = ..., roles: _Optional[_Iterable[_Union[RoleSpec, _Mapping]]] = ..., coordination: _Optional[_Union[Coordination, _Mapping]] = ..., slo_classes: _Optional[_Iterable[_Union[SLOClass, _Mapping]]] = ..., pd_protocol: _Optional[_Union[PDProtocol, str]] = ..., scheduler_profile: _Optional[str] = ..., kv_block_size: _Optional[int] = ..., perf_profile: _Optional[str] = ..., generation: _Optional[int] = ..., budget: _Optional[_Union[ReplicaBudget, _Mapping]] = ..., planner: _Optional[_Union[PlannerOverrides, _Mapping]] = ...) -> None: ...

class PlannerOverrides(_message.Message):
    __slots__ = ("policy", "predictor", "max_utilization", "decode_headroom", "stream_interval")
    POLICY_FIELD_NUMBER: _ClassVar[int]
    PREDICTOR_FIELD_NUMBER: _ClassVar[int]
    MAX_UTILIZATION_FIELD_NUMBER: _ClassVar[int]
    DECODE_HEADROOM_FIELD_NUMBER: _ClassVar[int]
    STREAM_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    policy: str
    predictor: str
    max_utilization: float
    decode_headroom: float
    stream_interval: int
    def __init__(self, policy: _Optional[str] = ..., predictor: _Optional[str] = ..., max_utilization: _Optional[float] = ..., decode_headroom: _Optional[float] = ..., stream_interval: _Optional[int] = ...) -> None: ...
