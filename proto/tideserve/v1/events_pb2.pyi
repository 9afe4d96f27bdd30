from tideserve.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RequestOutcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REQUEST_OUTCOME_UNSPECIFIED: _ClassVar[RequestOutcome]
    REQUEST_OUTCOME_OK: _ClassVar[RequestOutcome]
    REQUEST_OUTCOME_CLIENT_ERROR: _ClassVar[RequestOutcome]
    REQUEST_OUTCOME_SHED: _ClassVar[RequestOutcome]
    REQUEST_OUTCOME_TIMEOUT: _ClassVar[RequestOutcome]
    REQUEST_OUTCOME_UPSTREAM_ERROR: _ClassVar[RequestOutcome]
    REQUEST_OUTCOME_CANCELLED: _ClassVar[RequestOutcome]
REQUEST_OUTCOME_UNSPECIFIED: RequestOutcome
REQUEST_OUTCOME_OK: RequestOutcome
REQUEST_OUTCOME_CLIENT_ERROR: RequestOutcome
REQUEST_OUTCOME_SHED: RequestOutcome
REQUEST_OUTCOME_TIMEOUT: RequestOutcome
REQUEST_OUTCOME_UPSTREAM_ERROR: RequestOutcome
REQUEST_OUTCOME_CANCELLED: RequestOutcome

class KVEvent(_message.Message):
    __slots__ = ("kind", "tier", "block_hashes", "parent_hash", "token_count", "tenant", "lora")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        KIND_UNSPECIFIED: _ClassVar[KVEvent.Kind]
        KIND_BLOCK_STORED: _ClassVar[KVEvent.Kind]
        KIND_BLOCK_REMOVED: _ClassVar[KVEvent.Kind]
        KIND_ALL_CLEARED: _ClassVar[KVEvent.Kind]
    KIND_UNSPECIFIED: KVEvent.Kind
    KIND_BLOCK_STORED: KVEvent.Kind
    KIND_BLOCK_REMOVED: KVEvent.Kind
    KIND_ALL_CLEARED: KVEvent.Kind
    KIND_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    PARENT_HASH_FIELD_NUMBER: _ClassVar[int]
    TOKEN_COUNT_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    LORA_FIELD_NUMBER: _ClassVar[int]
    kind: KVEvent.Kind
    tier: _common_pb2.Tier
    block_hashes: _containers.RepeatedScalarFieldContainer[int]
    parent_hash: int
    token_count: int
    tenant: str
    lora: str
    def __init__(self, kind: _Optional[_Union[KVEvent.Kind, str]] = ..., tier: _Optional[_Union[_common_pb2.Tier, str]] = ..., block_hashes: _Optional[_Iterable[int]] = ..., parent_hash: _Optional[int] = ..., token_count: _Optional[int] = ..., tenant: _Optional[str] = ..., lora: _Optional[str] = ...) -> None: ...

class KVEventBatch(_message.Message):
    __slots__ = ("deployment", "instance_id", "epoch", "seq", "ts_ms", "events", "block_size", "full_state_continues")
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TS_MS_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    FULL_STATE_CONTINUES_FIELD_NUMBER: _ClassVar[int]
    deployment: str
    instance_id: str
    epoch: int
    seq: int
    ts_ms: int
    events: _containers.RepeatedCompositeFieldContainer[KVEvent]
    block_size: int
    full_state_continues: bool
    def __init__(self, deployment: _Optional[str] = ..., instance_id: _Optional[str] = ..., epoch: _Optional[int] = ..., seq: _Optional[int] = ..., ts_ms: _Optional[int] = ..., events: _Optional[_Iterable[_Union[KVEvent, _Mapping]]] = ..., block_size: _Optional[int] = ..., full_state_continues: _Optional[bool] = ...) -> None: ...

class ResyncRequest(_message.Message):
    __slots__ = ("deployment", "instance_id", "epoch", "reason", "requested_ms")
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_MS_FIELD_NUMBER: _ClassVar[int]
    deployment: str
    instance_id: str
    epoch: int
    reason: str
    requested_ms: int
    def __init__(self, deployment: _Optional[str] = ..., instance_id: _Optional[str] = ..., epoch: _Optional[int] = ..., reason: _Optional[str] = ..., requested_ms: _Optional[int] = ...) -> None: ...

class LoadSnapshot(_message.Message):
    __slots__ = ("deployment", "instance_id", "epoch", "ts_ms", "role", "num_running", "num_waiting", "kv_usage", "kv_capacity_blocks", "tokens_in_flight", "pending_prefill_tokens", "prefill_tokens_per_s", "decode_tokens_per_s", "cache_hit_rate", "endpoint")
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    TS_MS_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    NUM_RUNNING_FIELD_NUMBER: _ClassVar[int]
    NUM_WAITING_FIELD_NUMBER: _ClassVar[int]
    KV_USAGE_FIELD_NUMBER: _ClassVar[int]
    KV_CAPACITY_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    PENDING_PREFILL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PREFILL_TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    DECODE_TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    CACHE_HIT_RATE_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    deployment: str
    instance_id: str
    epoch: int
    ts_ms: int
    role: _common_pb2.Role
    num_running: int
    num_waiting: int
    kv_usage: float
    kv_capacity_blocks: int
    tokens_in_flight: int
    pending_prefill_tokens: int
    prefill_tokens_per_s: float
    decode_tokens_per_s: float
    cache_hit_rate: float
    endpoint: _common_pb2.Endpoint
    def __init__(self, deployment: _Optional[str] = ..., instance_id: _Optional[str] = ..., epoch: _Optional[int] = ..., ts_ms: _Optional[int] = ..., role: _Optional[_Union[_common_pb2.Role, str]] = ..., num_running: _Optional[int] = ..., num_waiting: _Optional[int] = ..., kv_usage: _Optional[float] = ..., kv_capacity_blocks: _Optional[int] = ..., tokens_in_flight: _Optional[int] = ..., pending_prefill_tokens: _Optional[int] = ..., prefill_tokens_per_s: _Optional[float] = ..., decode_tokens_per_s: _Optional[float] = ..., cache_hit_rate: _Optional[float] = ..., endpoint: _Optional[_Union[_common_pb2.Endpoint, _Mapping]] = ...) -> None: ...

class PluginScore(_message.Message):
    __slots__ = ("plugin", "score", "weight")
    PLUGIN_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    plugin: str
    score: float
    weight: float
    def __init__(self, plugin: _Optional[str] = ..., score: _Optional[float] = ..., weight: _Optional[float] = ...) -> None: ...

class RequestRecord(_message.Message):
    __slots__ = ("request_id", "trace_id", "deployment", "model", "tenant", "slo_class", "session_id", "profile", "prefill_instance", "decode_instance", "scores", "prompt_tokens", "completion_tokens", "predicted_cached_tokens", "cached_tokens", "predicted_ttft_ms", "queue_ms", "ttft_ms", "tpot_ms", "e2e_ms", "outcome", "http_status", "error", "retries", "arrival_ms", "finish_ms", "disaggregated", "replica_id", "source", "tools_offered", "tool_results", "tool_calls", "kv_transfer_ms", "engine_pending_prefill_tokens", "engine_running", "engine_tokens_in_flight", "kv_transfer_bytes", "kv_transfer_failed", "api", "parent_session_id")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TRACE_ID_FIELD_NUMBER: _ClassVar[int]
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    SLO_CLASS_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    PREFILL_INSTANCE_FIELD_NUMBER: _ClassVar[int]
    DECODE_INSTANCE_FIELD_NUMBER: _ClassVar[int]
    SCORES_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_TTFT_MS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_MS_FIELD_NUMBER: _ClassVar[int]
    TTFT_MS_FIELD_NUMBER: _ClassVar[int]
    TPOT_MS_FIELD_NUMBER: _ClassVar[int]
    E2E_MS_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    HTTP_STATUS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    RETRIES_FIELD_NUMBER: _ClassVar[int]
    ARRIVAL_MS_FIELD_NUMBER: _ClassVar[int]
    FINISH_MS_FIELD_NUMBER: _ClassVar[int]
    DISAGGREGATED_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    TOOLS_OFFERED_FIELD_NUMBER: _ClassVar[int]
    TOOL_RESULTS_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    KV_TRANSFER_MS_FIELD_NUMBER: _ClassVar[int]
    ENGINE_PENDING_PREFILL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ENGINE_RUNNING_FIELD_NUMBER: _ClassVar[int]
    ENGINE_TOKENS_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    KV_TRANSFER_BYTES_FIELD_NUMBER: _ClassVar[int]
    KV_TRANSFER_FAILED_FIELD_NUMBER: _ClassVar[int]
    API_FIELD_NUMBER: _ClassVar[int]
    PARENT_SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    trace_id: str
    deployment: str
    model: str
    tenant: str
    slo_class: str
    session_id: str
    profile: str
    prefill_instance: str
    decode_instance: str
    scores: _containers.RepeatedCompositeFieldContainer[PluginScore]
    prompt_tokens: int
    completion_tokens: int
    predicted_cached_tokens: int
    cached_tokens: int
    predicted_ttft_ms: float
    queue_ms: float
    ttft_ms: float
    tpot_ms: float
    e2e_ms: float
    outcome: RequestOutcome
    http_status: int
    error: str
    retries: int
    arrival_ms: int
    finish_ms: int
    disaggregated: bool
    replica_id: str
    source: str
    tools_offered: int
    tool_results: _containers.RepeatedCompositeFieldContainer[ToolResult]
    tool_calls: _containers.RepeatedCompositeFieldContainer[ToolCall]
    kv_transfer_ms: float
    engine_pending_prefill_tokens: int
    engine_running: int
    engine_tokens_in_flight: int
    kv_transfer_bytes: int
    kv_transfer_failed: bool
    api: str
    parent_session_id: str
    def __init__(self, request_id: _Optional[str] = ..., trace_id: _Optional[str] = ..., deployment: _Optional[str] = ..., model: _Optional[str] = ..., tenant: _Optional[str] = ..., slo_class: _Optional[str] = ..., session_id: _Optional[str] = ..., profile: _Optional[str] = ..., prefill_instance: _Optional[str] = ..., decode_instance: _Optional[str] = ..., scores: _Optional[_Iterable[_Union[PluginScore, _Mapping]]] = ..., prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., predicted_cached_tokens: _Optional[int] = ..., cached_tokens: _Optional[int] = ..., predicted_ttft_ms: _Optional[float] = ..., queue_ms: _Optional[float] = ..., ttft_ms: _Optional[float] = ..., tpot_ms: _Optional[float] = ..., e2e_ms: _Optional[float] = ..., outcome: _Optional[_Union[RequestOutcome, str]] = ..., http_status: _Optional[int] = ..., error: _Optional[str] = ..., retries: _Optional[int] = ..., arrival_ms: _Optional[int] = ..., finish_ms: _Optional[int] = ..., disaggregated: _Optional[bool] = ..., replica_id: _Optional[str] = ..., source: _Optional[str] = ..., tools_offered: _Optional[int] = ..., tool_results: _Optional[_Iterable[_Union[ToolResult, _Mapping]]] = ..., tool_calls: _Optional[_Iterable[_Union[ToolCall, _Mapping]]] = ..., kv_transfer_ms: _Optional[float] = ..., engine_pending_prefill_tokens: _Optional[int] = ..., engine_running: _Optional[int] = ..., engine_tokens_in_flight: _Optional[int] = ..., kv_transfer_bytes: _Optional[int] = ..., kv_transfer_failed: _Optional[bool] = ..., api: _Optional[str] = ..., parent_session_id: _Optional[str] = ...) -> None: ...

class ToolCall(_message.Message):
    __slots__ = ("id", "name", "argument_bytes", "arguments")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARGUMENT_BYTES_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_FIELD_NUMBER: _ClassVar[int]
    id: str
    name: str
    argument_bytes: int
    arguments: str
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., argument_bytes: _Optional[int] = ..., arguments: _Optional[str] = ...) -> None: ...

class ToolResult(_message.Message):
    __slots__ = ("tool_call_id", "name", "content_bytes", "content")
    TOOL_CALL_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    CONTENT_BYTES_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    tool_call_id: str
    name: str
    content_bytes: int
    content: str
    def __init__(self, tool_call_id: _Optional[str] = ..., name: _Optional[str] = ..., content_bytes: _Optional[int] = ..., content: _Optional[str] = ...) -> None: ...

class MembershipEvent(_message.Message):
    __slots__ = ("kind", "instance", "ts_ms", "reason")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        KIND_UNSPECIFIED: _ClassVar[MembershipEvent.Kind]
        KIND_ADDED: _ClassVar[MembershipEvent.Kind]
        KIND_STATE_CHANGED: _ClassVar[MembershipEvent.Kind]
        KIND_REMOVED: _ClassVar[MembershipEvent.Kind]
    KIND_UNSPECIFIED: MembershipEvent.Kind
    KIND_ADDED: MembershipEvent.Kind
    KIND_STATE_CHANGED: MembershipEvent.Kind
    KIND_REMOVED: MembershipEvent.Kind
    KIND_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    TS_MS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    kind: MembershipEvent.Kind
    instance: _common_pb2.Instance
    ts_ms: int
    reason: str
    def __init__(self, kind: _Optional[_Union[MembershipEvent.Kind, str]] = ..., instance: _Optional[_Union[_common_pb2.Instance, _Mapping]] = ..., ts_ms: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class DeadLetter(_message.Message):
    __slots__ = ("stream", "entry_id", "group", "error", "fields", "ts_ms")
    class FieldsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: bytes
        def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...
    STREAM_FIELD_NUMBER: _ClassVar[int]
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    FIELDS_FIELD_NUMBER: _ClassVar[int]
    TS_MS_FIELD_NUMBER: _ClassVar[int]
    stream: str
    entry_id: str
    group: str
    error: str
    fields: _containers.ScalarMap[str, bytes]
    ts_ms: int
    def __init__(self, stream: _Optional[str] = ..., entry_id: _Optional[str] = ..., group: _Optional[str] = ..., error: _Optional[str] = ..., fields: _Optional[_Mapping[str, bytes]] = ..., ts_ms: _Optional[int] = ...) -> None: ...

class RoutedPrefix(_message.Message):
    __slots__ = ("deployment", "replica_id", "block_hashes", "instance_ids", "ts_ms", "plugins", "request_id", "retracted", "prefill_ms", "cached_blocks", "answered")
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_IDS_FIELD_NUMBER: _ClassVar[int]
    TS_MS_FIELD_NUMBER: _ClassVar[int]
    PLUGINS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    RETRACTED_FIELD_NUMBER: _ClassVar[int]
    PREFILL_MS_FIELD_NUMBER: _ClassVar[int]
    CACHED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    ANSWERED_FIELD_NUMBER: _ClassVar[int]
    deployment: str
    replica_id: str
    block_hashes: _containers.RepeatedScalarFieldContainer[int]
    instance_ids: _containers.RepeatedScalarFieldContainer[str]
    ts_ms: int
    plugins: _containers.RepeatedScalarFieldContainer[str]
    request_id: str
    retracted: bool
    prefill_ms: float
    cached_blocks: int
    answered: bool
    def __init__(self, deployment: _Optional[str] = ..., replica_id: _Optional[str] = ..., block_hashes: _Optional[_Iterable[int]] = ..., instance_ids: _Optional[_Iterable[str]] = ..., ts_ms: _Optional[int] = ..., plugins: _Optional[_Iterable[str]] = ..., request_id: _Optional[str] = ..., retracted: _Optional[bool] = ..., prefill_ms: _Optional[float] = ..., cached_blocks: _Optional[int] = ..., answered: _Optional[bool] = ...) -> None: ...

class InstanceInFlight(_message.Message):
    __slots__ = ("instance_id", "requests", "pending_prefill_tokens", "dispatch_backlog_ms")
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    PENDING_PREFILL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DISPATCH_BACKLOG_MS_FIELD_NUMBER: _ClassVar[int]
    instance_id: str
    requests: int
    pending_prefill_tokens: int
    dispatch_backlog_ms: float
    def __init__(self, instance_id: _Optional[str] = ..., requests: _Optional[int] = ..., pending_prefill_tokens: _Optional[int] = ..., dispatch_backlog_ms: _Optional[float] = ...) -> None: ...

class ReplicaInFlight(_message.Message):
    __slots__ = ("deployment", "replica_id", "ts_ms", "instances")
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    TS_MS_FIELD_NUMBER: _ClassVar[int]
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    deployment: str
    replica_id: str
    ts_ms: int
    instances: _containers.RepeatedCompositeFieldContainer[InstanceInFlight]
    def __init__(self, deployment: _Optional[str] = ..., replica_id: _Optional[str] = ..., ts_ms: _Optional[int] = ..., instances: _Optional[_Iterable[_Union[InstanceInFlight, _Mapping]]] = ...) -> None: ...
