from tideserve.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ApplyDeploymentRequest(_message.Message):
    __slots__ = ("spec",)
    SPEC_FIELD_NUMBER: _ClassVar[int]
    spec: _common_pb2.DeploymentSpec
    def __init__(self, spec: _Optional[_Union[_common_pb2.DeploymentSpec, _Mapping]] = ...) -> None: ...

class ApplyDeploymentResponse(_message.Message):
    __slots__ = ("spec", "changed")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    spec: _common_pb2.DeploymentSpec
    changed: bool
    def __init__(self, spec: _Optional[_Union[_common_pb2.DeploymentSpec, _Mapping]] = ..., changed: _Optional[bool] = ...) -> None: ...

class GetDeploymentRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class RoleStatus(_message.Message):
    __slots__ = ("role", "desired", "ready", "starting", "draining", "failed")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    DESIRED_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    STARTING_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    role: str
    desired: int
    ready: int
    starting: int
    draining: int
    failed: int
    def __init__(self, role: _Optional[str] = ..., desired: _Optional[int] = ..., ready: _Optional[int] = ..., starting: _Optional[int] = ..., draining: _Optional[int] = ..., failed: _Optional[int] = ...) -> None: ...

class GetDeploymentResponse(_message.Message):
    __slots__ = ("spec", "instances", "roles", "recent_decisions", "progress")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    ROLES_FIELD_NUMBER: _ClassVar[int]
    RECENT_DECISIONS_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    spec: _common_pb2.DeploymentSpec
    instances: _containers.RepeatedCompositeFieldContainer[_common_pb2.Instance]
    roles: _containers.RepeatedCompositeFieldContainer[RoleStatus]
    recent_decisions: _containers.RepeatedCompositeFieldContainer[ScalingDecision]
    progress: str
    def __init__(self, spec: _Optional[_Union[_common_pb2.DeploymentSpec, _Mapping]] = ..., instances: _Optional[_Iterable[_Union[_common_pb2.Instance, _Mapping]]] = ..., roles: _Optional[_Iterable[_Union[RoleStatus, _Mapping]]] = ..., recent_decisions: _Optional[_Iterable[_Union[ScalingDecision, _Mapping]]] = ..., progress: _Optional[str] = ...) -> None: ...

class ListDeploymentsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListDeploymentsResponse(_message.Message):
    __slots__ = ("deployments",)
    DEPLOYMENTS_FIELD_NUMBER: _ClassVar[int]
    deployments: _containers.RepeatedCompositeFieldContainer[_common_pb2.DeploymentSpec]
    def __init__(self, deployments: _Optional[_Iterable[_Union[_common_pb2.DeploymentSpec, _Mapping]]] = ...) -> None: ...

class DeleteDeploymentRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class DeleteDeploymentResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListInstancesRequest(_message.Message):
    __slots__ = ("deployment",)
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    deployment: str
    def __init__(self, deployment: _Optional[str] = ...) -> None: ...

class ListInstancesResponse(_message.Message):
    __slots__ = ("instances",)
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    instances: _containers.RepeatedCompositeFieldContainer[_common_pb2.Instance]
    def __init__(self, instances: _Optional[_Iterable[_Union[_common_pb2.Instance, _Mapping]]] = ...) -> None: ...

class RoleChange(_message.Message):
    __slots__ = ("role", "from_replicas", "to_replicas")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    FROM_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    TO_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    role: str
    from_replicas: int
    to_replicas: int
    def __init__(self, role: _Optional[str] = ..., from_replicas: _Optional[int] = ..., to_replicas: _Optional[int] = ...) -> None: ...

class ScalingDecision(_message.Message):
    __slots__ = ("decision_id", "deployment", "ts_ms", "changes", "reasons", "status", "binding_constraint", "victims", "generation", "inputs_json", "forecast_json")
    DECISION_ID_FIELD_NUMBER: _ClassVar[int]
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    TS_MS_FIELD_NUMBER: _ClassVar[int]
    CHANGES_FIELD_NUMBER: _ClassVar[int]
    REASONS_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    BINDING_CONSTRAINT_FIELD_NUMBER: _ClassVar[int]
    VICTIMS_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    INPUTS_JSON_FIELD_NUMBER: _ClassVar[int]
    FORECAST_JSON_FIELD_NUMBER: _ClassVar[int]
    decision_id: str
    deployment: str
    ts_ms: int
    changes: _containers.RepeatedCompositeFieldContainer[RoleChange]
    reasons: _containers.RepeatedScalarFieldContainer[str]
    status: str
    binding_constraint: str
    victims: _containers.RepeatedScalarFieldContainer[str]
    generation: int
    inputs_json: str
    forecast_json: str
    def __init__(self, decision_id: _Optional[str] = ..., deployment: _Optional[str] = ..., ts_ms: _Optional[int] = ..., changes: _Optional[_Iterable[_Union[RoleChange, _Mapping]]] = ..., reasons: _Optional[_Iterable[str]] = ..., status: _Optional[str] = ..., binding_constraint: _Optional[str] = ..., victims: _Optional[_Iterable[str]] = ..., generation: _Optional[int] = ..., inputs_json: _Optional[str] = ..., forecast_json: _Optional[str] = ...) -> None: ...

class PlanRequest(_message.Message):
    __slots__ = ("deployment",)
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    deployment: str
    def __init__(self, deployment: _Optional[str] = ...) -> None: ...

class PlanResponse(_message.Message):
    __slots__ = ("decision",)
    DECISION_FIELD_NUMBER: _ClassVar[int]
    decision: ScalingDecision
    def __init__(self, decision: _Optional[_Union[ScalingDecision, _Mapping]] = ...) -> None: ...

class ScaleRoleRequest(_message.Message):
    __slots__ = ("deployment", "role", "replicas", "pin", "release")
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    PIN_FIELD_NUMBER: _ClassVar[int]
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    deployment: str
    role: str
    replicas: int
    pin: bool
    release: bool
    def __init__(self, deployment: _Optional[str] = ..., role: _Optional[str] = ..., replicas: _Optional[int] = ..., pin: _Optional[bool] = ..., release: _Optional[bool] = ...) -> None: ...

class ScaleRoleResponse(_message.Message):
    __slots__ = ("decision",)
    DECISION_FIELD_NUMBER: _ClassVar[int]
    decision: ScalingDecision
    def __init__(self, decision: _Optional[_Union[ScalingDecision, _Mapping]] = ...) -> None: ...

class ListDecisionsRequest(_message.Message):
    __slots__ = ("deployment", "limit")
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    deployment: str
    limit: int
    def __init__(self, deployment: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class ListDecisionsResponse(_message.Message):
    __slots__ = ("decisions",)
    DECISIONS_FIELD_NUMBER: _ClassVar[int]
    decisions: _containers.RepeatedCompositeFieldContainer[ScalingDecision]
    def __init__(self, decisions: _Optional[_Iterable[_Union[ScalingDecision, _Mapping]]] = ...) -> None: ...
