from tideserve.v1 import common_pb2 as _common_pb2
from tideserve.v1 import events_pb2 as _events_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PickRequest(_message.Message):
    __slots__ = ("deployment", "prompt_token_ids", "prompt_text", "block_hashes", "prompt_tokens", "max_tokens", "tenant", "slo_class", "session_id", "profile", "deadline_ms", "exclude_instances", "report_outcomes", "traceparent", "tag", "parent_session_id")
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TEXT_FIELD_NUMBER: _ClassVar[int]
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    SLO_CLASS_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_MS_FIELD_NUMBER: _ClassVar[int]
    EXCLUDE_INSTANCES_FIELD_NUMBER: _ClassVar[int]
    REPORT_OUTCOMES_FIELD_NUMBER: _ClassVar[int]
    TRACEPARENT_FIELD_NUMBER: _ClassVar[int]
    TAG_FIELD_NUMBER: _ClassVar[int]
    PARENT_SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    deployment: str
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    prompt_text: str
    block_hashes: _containers.RepeatedScalarFieldContainer[int]
    prompt_tokens: int
    max_tokens: int
    tenant: str
    slo_class: str
    session_id: str
    profile: str
    deadline_ms: int
    exclude_instances: _containers.RepeatedScalarFieldContainer[str]
    report_outcomes: _containers.RepeatedCompositeFieldContainer[ReportOutcomeRequest]
    traceparent: str
    tag: str
    parent_session_id: str
    def __init__(self, deployment: _Optional[str] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., prompt_text: _Optional[str] = ..., block_hashes: _Optional[_Iterable[int]] = ..., prompt_tokens: _Optional[int] = ..., max_tokens: _Optional[int] = ..., tenant: _Optional[str] = ..., slo_class: _Optional[str] = ..., session_id: _Optional[str] = ..., profile: _Optional[str] = ..., deadline_ms: _Optional[int] = ..., exclude_instances: _Optional[_Iterable[str]] = ..., report_outcomes: _Optional[_Iterable[_Union[ReportOutcomeRequest, _Mapping]]] = ..., traceparent: _Optional[str] = ..., tag: _Optional[str] = ..., parent_session_id: _Optional[str] = ...) -> None: ...

class PickError(_message.Message):
    __slots__ = ("code", "message", "retry_after_ms")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_MS_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    retry_after_ms: int
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ..., retry_after_ms: _Optional[int] = ...) -> None: ...

class PickedEndpoint(_message.Message):
    __slots__ = ("instance", "score", "scores")
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    SCORES_FIELD_NUMBER: _ClassVar[int]
    instance: _common_pb2.Instance
    score: float
    scores: _containers.RepeatedCompositeFieldContainer[_events_pb2.PluginScore]
    def __init__(self, instance: _Optional[_Union[_common_pb2.Instance, _Mapping]] = ..., score: _Optional[float] = ..., scores: _Optional[_Iterable[_Union[_events_pb2.PluginScore, _Mapping]]] = ...) -> None: ...

class PickResponse(_message.Message):
    __slots__ = ("pick_id", "prefill", "decode", "disaggregated", "bootstrap_host", "bootstrap_port", "bootstrap_room", "predicted_cached_tokens", "predicted_ttft_ms", "profile", "error", "tag")
    PICK_ID_FIELD_NUMBER: _ClassVar[int]
    PREFILL_FIELD_NUMBER: _ClassVar[int]
    DECODE_FIELD_NUMBER: _ClassVar[int]
    DISAGGREGATED_FIELD_NUMBER: _ClassVar[int]
    BOOTSTRAP_HOST_FIELD_NUMBER: _ClassVar[int]
    BOOTSTRAP_PORT_FIELD_NUMBER: _ClassVar[int]
    BOOTSTRAP_ROOM_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_TTFT_MS_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    TAG_FIELD_NUMBER: _ClassVar[int]
    pick_id: str
    prefill: PickedEndpoint
    decode: PickedEndpoint
    disaggregated: bool
    bootstrap_host: str
    bootstrap_port: int
    bootstrap_room: int
    predicted_cached_tokens: int
    predicted_ttft_ms: float
    profile: str
    error: PickError
    tag: str
    def __init__(self, pick_id: _Optional[str] = ..., prefill: _Optional[_Union[PickedEndpoint, _Mapping]] = ..., decode: _Optional[_Union[PickedEndpoint, _Mapping]] = ..., disaggregated: _Optional[bool] = ..., bootstrap_host: _Optional[str] = ..., bootstrap_port: _Optional[int] = ..., bootstrap_room: _Optional[int] = ..., predicted_cached_tokens: _Optional[int] = ..., predicted_ttft_ms: _Optional[float] = ..., profile: _Optional[str] = ..., error: _Optional[_Union[PickError, _Mapping]] = ..., tag: _Optional[str] = ...) -> None: ...

class ReportOutcomeRequest(_message.Message):
    __slots__ = ("pick_id", "outcome", "prompt_tokens", "completion_tokens", "cached_tokens", "ttft_ms", "tpot_ms", "e2e_ms")
    PICK_ID_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TTFT_MS_FIELD_NUMBER: _ClassVar[int]
    TPOT_MS_FIELD_NUMBER: _ClassVar[int]
    E2E_MS_FIELD_NUMBER: _ClassVar[int]
    pick_id: str
    outcome: _events_pb2.RequestOutcome
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    ttft_ms: float
    tpot_ms: float
    e2e_ms: float
    def __init__(self, pick_id: _Optional[str] = ..., outcome: _Optional[_Union[_events_pb2.RequestOutcome, str]] = ..., prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., cached_tokens: _Optional[int] = ..., ttft_ms: _Optional[float] = ..., tpot_ms: _Optional[float] = ..., e2e_ms: _Optional[float] = ...) -> None: ...

class ReportOutcomeResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class EndpointStatus(_message.Message):
    __slots__ = ("instance", "load", "healthy", "draining", "circuit", "in_flight")
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    HEALTHY_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    CIRCUIT_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    instance: _common_pb2.Instance
    load: _events_pb2.LoadSnapshot
    healthy: bool
    draining: bool
    circuit: str
    in_flight: int
    def __init__(self, instance: _Optional[_Union[_common_pb2.Instance, _Mapping]] = ..., load: _Optional[_Union[_events_pb2.LoadSnapshot, _Mapping]] = ..., healthy: _Optional[bool] = ..., draining: _Optional[bool] = ..., circuit: _Optional[str] = ..., in_flight: _Optional[int] = ...) -> None: ...

class ListEndpointsRequest(_message.Message):
    __slots__ = ("deployment",)
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    deployment: str
    def __init__(self, deployment: _Optional[str] = ...) -> None: ...

class ListEndpointsResponse(_message.Message):
    __slots__ = ("endpoints",)
    ENDPOINTS_FIELD_NUMBER: _ClassVar[int]
    endpoints: _containers.RepeatedCompositeFieldContainer[EndpointStatus]
    def __init__(self, endpoints: _Optional[_Iterable[_Union[EndpointStatus, _Mapping]]] = ...) -> None: ...

class DrainRequest(_message.Message):
    __slots__ = ("instance_id",)
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    instance_id: str
    def __init__(self, instance_id: _Optional[str] = ...) -> None: ...

class DrainResponse(_message.Message):
    __slots__ = ("in_flight",)
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    in_flight: int
    def __init__(self, in_flight: _Optional[int] = ...) -> None: ...

class UndrainRequest(_message.Message):
    __slots__ = ("instance_id",)
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    instance_id: str
    def __init__(self, instance_id: _Optional[str] = ...) -> None: ...

class UndrainResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
