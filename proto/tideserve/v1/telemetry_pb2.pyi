from tideserve.v1 import common_pb2 as _common_pb2
from tideserve.v1 import events_pb2 as _events_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ReportRecordsResponse(_message.Message):
    __slots__ = ("accepted", "duplicates", "rejected", "errors")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    DUPLICATES_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    accepted: int
    duplicates: int
    rejected: int
    errors: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, accepted: _Optional[int] = ..., duplicates: _Optional[int] = ..., rejected: _Optional[int] = ..., errors: _Optional[_Iterable[str]] = ...) -> None: ...

class Percentiles(_message.Message):
    __slots__ = ("mean", "p50", "p90", "p99")
    MEAN_FIELD_NUMBER: _ClassVar[int]
    P50_FIELD_NUMBER: _ClassVar[int]
    P90_FIELD_NUMBER: _ClassVar[int]
    P99_FIELD_NUMBER: _ClassVar[int]
    mean: float
    p50: float
    p90: float
    p99: float
    def __init__(self, mean: _Optional[float] = ..., p50: _Optional[float] = ..., p90: _Optional[float] = ..., p99: _Optional[float] = ...) -> None: ...

class QueryWindowRequest(_message.Message):
    __slots__ = ("deployment", "window_s", "end_ms", "slo_class", "tenant", "role")
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    WINDOW_S_FIELD_NUMBER: _ClassVar[int]
    END_MS_FIELD_NUMBER: _ClassVar[int]
    SLO_CLASS_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    deployment: str
    window_s: float
    end_ms: int
    slo_class: str
    tenant: str
    role: str
    def __init__(self, deployment: _Optional[str] = ..., window_s: _Optional[float] = ..., end_ms: _Optional[int] = ..., slo_class: _Optional[str] = ..., tenant: _Optional[str] = ..., role: _Optional[str] = ...) -> None: ...

class ClassAttainment(_message.Message):
    __slots__ = ("slo_class", "percentile", "ttft_target_ms", "tpot_target_ms", "ttft_ms", "tpot_ms", "ttft_attainment", "tpot_attainment", "met")
    SLO_CLASS_FIELD_NUMBER: _ClassVar[int]
    PERCENTILE_FIELD_NUMBER: _ClassVar[int]
    TTFT_TARGET_MS_FIELD_NUMBER: _ClassVar[int]
    TPOT_TARGET_MS_FIELD_NUMBER: _ClassVar[int]
    TTFT_MS_FIELD_NUMBER: _ClassVar[int]
    TPOT_MS_FIELD_NUMBER: _ClassVar[int]
    TTFT_ATTAINMENT_FIELD_NUMBER: _ClassVar[int]
    TPOT_ATTAINMENT_FIELD_NUMBER: _ClassVar[int]
    MET_FIELD_NUMBER: _ClassVar[int]
    slo_class: str
    percentile: float
    ttft_target_ms: float
    tpot_target_ms: float
    ttft_ms: float
    tpot_ms: float
    ttft_attainment: float
    tpot_attainment: float
    met: bool
    def __init__(self, slo_class: _Optional[str] = ..., percentile: _Optional[float] = ..., ttft_target_ms: _Optional[float] = ..., tpot_target_ms: _Optional[float] = ..., ttft_ms: _Optional[float] = ..., tpot_ms: _Optional[float] = ..., ttft_attainment: _Optional[float] = ..., tpot_attainment: _Optional[float] = ..., met: _Optional[bool] = ...) -> None: ...

class WindowStats(_message.Message):
    __slots__ = ("deployment", "role", "slo_class", "tenant", "start_ms", "end_ms", "requests", "request_rate_rps", "input_tokens_per_s", "output_tokens_per_s", "input_tokens", "output_tokens", "queue_ms", "ttft_ms", "tpot_ms", "e2e_ms", "kv_transfer_ms", "cache_hit_ratio", "cached_tokens_abs_error", "cached_tokens_error_ratio", "goodput_rps", "slo_attainment", "error_rate", "shed_rate", "classes")
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    SLO_CLASS_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    START_MS_FIELD_NUMBER: _ClassVar[int]
    END_MS_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_RATE_RPS_FIELD_NUMBER: _ClassVar[int]
    INPUT_TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    INPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_MS_FIELD_NUMBER: _ClassVar[int]
    TTFT_MS_FIELD_NUMBER: _ClassVar[int]
    TPOT_MS_FIELD_NUMBER: _ClassVar[int]
    E2E_MS_FIELD_NUMBER: _ClassVar[int]
    KV_TRANSFER_MS_FIELD_NUMBER: _ClassVar[int]
    CACHE_HIT_RATIO_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_ABS_ERROR_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_ERROR_RATIO_FIELD_NUMBER: _ClassVar[int]
    GOODPUT_RPS_FIELD_NUMBER: _ClassVar[int]
    SLO_ATTAINMENT_FIELD_NUMBER: _ClassVar[int]
    ERROR_RATE_FIELD_NUMBER: _ClassVar[int]
    SHED_RATE_FIELD_NUMBER: _ClassVar[int]
    CLASSES_FIELD_NUMBER: _ClassVar[int]
    deployment: str
    role: str
    slo_class: str
    tenant: str
    start_ms: int
    end_ms: int
    requests: int
    request_rate_rps: float
    input_tokens_per_s: float
    output_tokens_per_s: float
    input_tokens: Percentiles
    output_tokens: Percentiles
    queue_ms: Percentiles
    ttft_ms: Percentiles
    tpot_ms: Percentiles
    e2e_ms: Percentiles
    kv_transfer_ms: Percentiles
    cache_hit_ratio: float
    cached_tokens_abs_error: float
    cached_tokens_error_ratio: float
    goodput_rps: float
    slo_attainment: float
    error_rate: float
    shed_rate: float
    classes: _containers.RepeatedCompositeFieldContainer[ClassAttainment]
    def __init__(self, deployment: _Optional[str] = ..., role: _Optional[str] = ..., slo_class: _Optional[str] = ..., tenant: _Optional[str] = ..., start_ms: _Optional[int] = ..., end_ms: _Optional[int] = ..., requests: _Optional[int] = ..., request_rate_rps: _Optional[float] = ..., input_tokens_per_s: _Optional[float] = ..., output_tokens_per_s: _Optional[float] = ..., input_tokens: _Optional[_Union[Percentiles, _Mapping]] = ..., output_tokens: _Optional[_Union[Percentiles, _Mapping]] = ..., queue_ms: _Optional[_Union[Percentiles, _Mapping]] = ..., ttft_ms: _Optional[_Union[Percentiles, _Mapping]] = ..., tpot_ms: _Optional[_Union[Percentiles, _Mapping]] = ..., e2e_ms: _Optional[_Union[Percentiles, _Mapping]] = ..., kv_transfer_ms: _Optional[_Union[Percentiles, _Mapping]] = ..., cache_hit_ratio: _Optional[float] = ..., cached_tokens_abs_error: _Optional[float] = ..., cached_tokens_error_ratio: _Optional[float] = ..., goodput_rps: _Optional[float] = ..., slo_attainment: _Optional[float] = ..., error_rate: _Optional[float] = ..., shed_rate: _Optional[float] = ..., classes: _Optional[_Iterable[_Union[ClassAttainment, _Mapping]]] = ...) -> None: ...

class QueryWindowResponse(_message.Message):
    __slots__ = ("total", "slices", "relative_accuracy", "source")
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    SLICES_FIELD_NUMBER: _ClassVar[int]
    RELATIVE_ACCURACY_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    total: WindowStats
    slices: _containers.RepeatedCompositeFieldContainer[WindowStats]
    relative_accuracy: float
    source: str
    def __init__(self, total: _Optional[_Union[WindowStats, _Mapping]] = ..., slices: _Optional[_Iterable[_Union[WindowStats, _Mapping]]] = ..., relative_accuracy: _Optional[float] = ..., source: _Optional[str] = ...) -> None: ...

class PerfModel(_message.Message):
    __slots__ = ("profile", "prefill_base_ms", "prefill_ms_per_token", "prefill_ms_per_token2", "decode_base_ms", "decode_ms_per_seq", "decode_ms_per_ktoken", "kv_bytes_per_token", "samples", "deployment", "role", "transfer_base_ms", "transfer_ms_per_mb", "startup_s", "startup_samples", "prefill_confidence", "decode_confidence", "prefill_error", "decode_error", "fitted_ms")
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    PREFILL_BASE_MS_FIELD_NUMBER: _ClassVar[int]
    PREFILL_MS_PER_TOKEN_FIELD_NUMBER: _ClassVar[int]
    PREFILL_MS_PER_TOKEN2_FIELD_NUMBER: _ClassVar[int]
    DECODE_BASE_MS_FIELD_NUMBER: _ClassVar[int]
    DECODE_MS_PER_SEQ_FIELD_NUMBER: _ClassVar[int]
    DECODE_MS_PER_KTOKEN_FIELD_NUMBER: _ClassVar[int]
    KV_BYTES_PER_TOKEN_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_BASE_MS_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_MS_PER_MB_FIELD_NUMBER: _ClassVar[int]
    STARTUP_S_FIELD_NUMBER: _ClassVar[int]
    STARTUP_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    PREFILL_CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    DECODE_CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    PREFILL_ERROR_FIELD_NUMBER: _ClassVar[int]
    DECODE_ERROR_FIELD_NUMBER: _ClassVar[int]
    FITTED_MS_FIELD_NUMBER: _ClassVar[int]
    profile: str
    prefill_base_ms: float
    prefill_ms_per_token: float
    prefill_ms_per_token2: float
    decode_base_ms: float
    decode_ms_per_seq: float
    decode_ms_per_ktoken: float
    kv_bytes_per_token: int
    samples: int
    deployment: str
    role: _common_pb2.Role
    transfer_base_ms: float
    transfer_ms_per_mb: float
    startup_s: float
    startup_samples: int
    prefill_confidence: float
    decode_confidence: float
    prefill_error: float
    decode_error: float
    fitted_ms: int
    def __init__(self, profile: _Optional[str] = ..., prefill_base_ms: _Optional[float] = ..., prefill_ms_per_token: _Optional[float] = ..., prefill_ms_per_token2: _Optional[float] = ..., decode_base_ms: _Optional[float] = ..., decode_ms_per_seq: _Optional[float] = ..., decode_ms_per_ktoken: _Optional[float] = ..., kv_bytes_per_token: _Optional[int] = ..., samples: _Optional[int] = ..., deployment: _Optional[str] = ..., role: _Optional[_Union[_common_pb2.Role, str]] = ..., transfer_base_ms: _Optional[float] = ..., transfer_ms_per_mb: _Optional[float] = ..., startup_s: _Optional[float] = ..., startup_samples: _Optional[int] = ..., prefill_confidence: _Optional[float] = ..., decode_confidence: _Optional[float] = ..., prefill_error: _Optional[float] = ..., decode_error: _Optional[float] = ..., fitted_ms: _Optional[int] = ...) -> None: ...

class GetPerfModelRequest(_message.Message):
    __slots__ = ("deployment", "role")
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    deployment: str
    role: _common_pb2.Role
    def __init__(self, deployment: _Optional[str] = ..., role: _Optional[_Union[_common_pb2.Role, str]] = ...) -> None: ...

class GetPerfModelResponse(_message.Message):
    __slots__ = ("model",)
    MODEL_FIELD_NUMBER: _ClassVar[int]
    model: PerfModel
    def __init__(self, model: _Optional[_Union[PerfModel, _Mapping]] = ...) -> None: ...

class GetRecommendationRequest(_message.Message):
    __slots__ = ("deployment", "window_s", "disaggregated")
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    WINDOW_S_FIELD_NUMBER: _ClassVar[int]
    DISAGGREGATED_FIELD_NUMBER: _ClassVar[int]
    deployment: str
    window_s: float
    disaggregated: bool
    def __init__(self, deployment: _Optional[str] = ..., window_s: _Optional[float] = ..., disaggregated: _Optional[bool] = ...) -> None: ...

class GetRecommendationResponse(_message.Message):
    __slots__ = ("prefill_replicas", "decode_replicas", "worker_replicas", "reasons", "binding_constraint", "pd_ratio", "request_rate_rps", "mean_input_tokens", "mean_output_tokens", "cache_hit_ratio")
    PREFILL_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    DECODE_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    WORKER_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    REASONS_FIELD_NUMBER: _ClassVar[int]
    BINDING_CONSTRAINT_FIELD_NUMBER: _ClassVar[int]
    PD_RATIO_FIELD_NUMBER: _ClassVar[int]
    REQUEST_RATE_RPS_FIELD_NUMBER: _ClassVar[int]
    MEAN_INPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MEAN_OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHE_HIT_RATIO_FIELD_NUMBER: _ClassVar[int]
    prefill_replicas: int
    decode_replicas: int
    worker_replicas: int
    reasons: _containers.RepeatedScalarFieldContainer[str]
    binding_constraint: str
    pd_ratio: float
    request_rate_rps: float
    mean_input_tokens: float
    mean_output_tokens: float
    cache_hit_ratio: float
    def __init__(self, prefill_replicas: _Optional[int] = ..., decode_replicas: _Optional[int] = ..., worker_replicas: _Optional[int] = ..., reasons: _Optional[_Iterable[str]] = ..., binding_constraint: _Optional[str] = ..., pd_ratio: _Optional[float] = ..., request_rate_rps: _Optional[float] = ..., mean_input_tokens: _Optional[float] = ..., mean_output_tokens: _Optional[float] = ..., cache_hit_ratio: _Optional[float] = ...) -> None: ...

class GetSessionRequest(_message.Message):
    __slots__ = ("session_id", "limit", "tenant")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    limit: int
    tenant: str
    def __init__(self, session_id: _Optional[str] = ..., limit: _Optional[int] = ..., tenant: _Optional[str] = ...) -> None: ...

class GetSessionResponse(_message.Message):
    __slots__ = ("turns",)
    TURNS_FIELD_NUMBER: _ClassVar[int]
    turns: _containers.RepeatedCompositeFieldContainer[_events_pb2.RequestRecord]
    def __init__(self, turns: _Optional[_Iterable[_Union[_events_pb2.RequestRecord, _Mapping]]] = ...) -> None: ...

class GetToolTimesRequest(_message.Message):
    __slots__ = ("deployment", "percentiles", "min_samples")
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    PERCENTILES_FIELD_NUMBER: _ClassVar[int]
    MIN_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    deployment: str
    percentiles: _containers.RepeatedScalarFieldContainer[float]
    min_samples: int
    def __init__(self, deployment: _Optional[str] = ..., percentiles: _Optional[_Iterable[float]] = ..., min_samples: _Optional[int] = ...) -> None: ...

class ToolTime(_message.Message):
    __slots__ = ("agent", "tool", "samples", "seconds")
    AGENT_FIELD_NUMBER: _ClassVar[int]
    TOOL_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    agent: str
    tool: str
    samples: int
    seconds: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, agent: _Optional[str] = ..., tool: _Optional[str] = ..., samples: _Optional[int] = ..., seconds: _Optional[_Iterable[float]] = ...) -> None: ...

class GetToolTimesResponse(_message.Message):
    __slots__ = ("percentiles", "tool_times", "sessions_tracked")
    PERCENTILES_FIELD_NUMBER: _ClassVar[int]
    TOOL_TIMES_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_TRACKED_FIELD_NUMBER: _ClassVar[int]
    percentiles: _containers.RepeatedScalarFieldContainer[float]
    tool_times: _containers.RepeatedCompositeFieldContainer[ToolTime]
    sessions_tracked: int
    def __init__(self, percentiles: _Optional[_Iterable[float]] = ..., tool_times: _Optional[_Iterable[_Union[ToolTime, _Mapping]]] = ..., sessions_tracked: _Optional[int] = ...) -> None: ...
