from tideserve.v1 import events_pb2 as _events_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ReportRecordsResponse(_message.Message):
    __slots__ = ("accepted", "duplicates")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    DUPLICATES_FIELD_NUMBER: _ClassVar[int]
    accepted: int
    duplicates: int
    def __init__(self, accepted: _Optional[int] = ..., duplicates: _Optional[int] = ...) -> None: ...

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
    __slots__ = ("deployment", "window_s", "end_ms", "slo_class", "tenant")
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    WINDOW_S_FIELD_NUMBER: _ClassVar[int]
    END_MS_FIELD_NUMBER: _ClassVar[int]
    SLO_CLASS_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    deployment: str
    window_s: float
    end_ms: int
    slo_class: str
    tenant: str
    def __init__(self, deployment: _Optional[str] = ..., window_s: _Optional[float] = ..., end_ms: _Optional[int] = ..., slo_class: _Optional[str] = ..., tenant: _Optional[str] = ...) -> None: ...

class QueryWindowResponse(_message.Message):
    __slots__ = ("requests", "request_rate_rps", "input_tokens_per_s", "output_tokens_per_s", "ttft_ms", "tpot_ms", "e2e_ms", "queue_ms", "cache_hit_ratio", "slo_attainment", "error_rate", "mean_input_tokens", "mean_output_tokens")
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_RATE_RPS_FIELD_NUMBER: _ClassVar[int]
    INPUT_TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    TTFT_MS_FIELD_NUMBER: _ClassVar[int]
    TPOT_MS_FIELD_NUMBER: _ClassVar[int]
    E2E_MS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_MS_FIELD_NUMBER: _ClassVar[int]
    CACHE_HIT_RATIO_FIELD_NUMBER: _ClassVar[int]
    SLO_ATTAINMENT_FIELD_NUMBER: _ClassVar[int]
    ERROR_RATE_FIELD_NUMBER: _ClassVar[int]
    MEAN_INPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MEAN_OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    requests: int
    request_rate_rps: float
    input_tokens_per_s: float
    output_tokens_per_s: float
    ttft_ms: Percentiles
    tpot_ms: Percentiles
    e2e_ms: Percentiles
    queue_ms: Percentiles
    cache_hit_ratio: float
    slo_attainment: float
    error_rate: float
    mean_input_tokens: float
    mean_output_tokens: float
    def __init__(self, requests: _Optional[int] = ..., request_rate_rps: _Optional[float] = ..., input_tokens_per_s: _Optional[float] = ..., output_tokens_per_s: _Optional[float] = ..., ttft_ms: _Optional[_Union[Percentiles, _Mapping]] = ..., tpot_ms: _Optional[_Union[Percentiles, _Mapping]] = ..., e2e_ms: _Optional[_Union[Percentiles, _Mapping]] = ..., queue_ms: _Optional[_Union[Percentiles, _Mapping]] = ..., cache_hit_ratio: _Optional[float] = ..., slo_attainment: _Optional[float] = ..., error_rate: _Optional[float] = ..., mean_input_tokens: _Optional[float] = ..., mean_output_tokens: _Optional[float] = ...) -> None: ...

class PerfModel(_message.Message):
    __slots__ = ("profile", "prefill_base_ms", "prefill_ms_per_token", "prefill_ms_per_token2", "decode_base_ms", "decode_ms_per_seq", "decode_ms_per_ktoken", "kv_bytes_per_token", "samples")
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    PREFILL_BASE_MS_FIELD_NUMBER: _ClassVar[int]
    PREFILL_MS_PER_TOKEN_FIELD_NUMBER: _ClassVar[int]
    PREFILL_MS_PER_TOKEN2_FIELD_NUMBER: _ClassVar[int]
    DECODE_BASE_MS_FIELD_NUMBER: _ClassVar[int]
    DECODE_MS_PER_SEQ_FIELD_NUMBER: _ClassVar[int]
    DECODE_MS_PER_KTOKEN_FIELD_NUMBER: _ClassVar[int]
    KV_BYTES_PER_TOKEN_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    profile: str
    prefill_base_ms: float
    prefill_ms_per_token: float
    prefill_ms_per_token2: float
    decode_base_ms: float
    decode_ms_per_seq: float
    decode_ms_per_ktoken: float
    kv_bytes_per_token: int
    samples: int
    def __init__(self, profile: _Optional[str] = ..., prefill_base_ms: _Optional[float] = ..., prefill_ms_per_token: _Optional[float] = ..., prefill_ms_per_token2: _Optional[float] = ..., decode_base_ms: _Optional[float] = ..., decode_ms_per_seq: _Optional[float] = ..., decode_ms_per_ktoken: _Optional[float] = ..., kv_bytes_per_token: _Optional[int] = ..., samples: _Optional[int] = ...) -> None: ...

class GetPerfModelRequest(_message.Message):
    __slots__ = ("deployment",)
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    deployment: str
    def __init__(self, deployment: _Optional[str] = ...) -> None: ...

class GetPerfModelResponse(_message.Message):
    __slots__ = ("model",)
    MODEL_FIELD_NUMBER: _ClassVar[int]
    model: PerfModel
    def __init__(self, model: _Optional[_Union[PerfModel, _Mapping]] = ...) -> None: ...

class GetRecommendationRequest(_message.Message):
    __slots__ = ("deployment", "window_s")
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    WINDOW_S_FIELD_NUMBER: _ClassVar[int]
    deployment: str
    window_s: float
    def __init__(self, deployment: _Optional[str] = ..., window_s: _Optional[float] = ...) -> None: ...

class GetRecommendationResponse(_message.Message):
    __slots__ = ("prefill_replicas", "decode_replicas", "worker_replicas", "reasons")
    PREFILL_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    DECODE_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    WORKER_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    REASONS_FIELD_NUMBER: _ClassVar[int]
    prefill_replicas: int
    decode_replicas: int
    worker_replicas: int
    reasons: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, prefill_replicas: _Optional[int] = ..., decode_replicas: _Optional[int] = ..., worker_replicas: _Optional[int] = ..., reasons: _Optional[_Iterable[str]] = ...) -> None: ...
