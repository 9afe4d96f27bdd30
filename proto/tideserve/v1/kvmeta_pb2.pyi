from tideserve.v1 import common_pb2 as _common_pb2
from tideserve.v1 import events_pb2 as _events_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SessionPhase(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SESSION_PHASE_UNSPECIFIED: _ClassVar[SessionPhase]
    SESSION_PHASE_ACTIVE: _ClassVar[SessionPhase]
    SESSION_PHASE_IDLE: _ClassVar[SessionPhase]
    SESSION_PHASE_ENDED: _ClassVar[SessionPhase]

class MigrationFate(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MIGRATION_FATE_UNSPECIFIED: _ClassVar[MigrationFate]
    MIGRATION_FATE_MOVE: _ClassVar[MigrationFate]
    MIGRATION_FATE_TIER: _ClassVar[MigrationFate]
    MIGRATION_FATE_DROP: _ClassVar[MigrationFate]
SESSION_PHASE_UNSPECIFIED: SessionPhase
SESSION_PHASE_ACTIVE: SessionPhase
SESSION_PHASE_IDLE: SessionPhase
SESSION_PHASE_ENDED: SessionPhase
MIGRATION_FATE_UNSPECIFIED: MigrationFate
MIGRATION_FATE_MOVE: MigrationFate
MIGRATION_FATE_TIER: MigrationFate
MIGRATION_FATE_DROP: MigrationFate

class MatchPrefixRequest(_message.Message):
    __slots__ = ("deployment", "tenant", "block_hashes", "candidate_instances", "lora")
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_INSTANCES_FIELD_NUMBER: _ClassVar[int]
    LORA_FIELD_NUMBER: _ClassVar[int]
    deployment: str
    tenant: str
    block_hashes: _containers.RepeatedScalarFieldContainer[int]
    candidate_instances: _containers.RepeatedScalarFieldContainer[str]
    lora: str
    def __init__(self, deployment: _Optional[str] = ..., tenant: _Optional[str] = ..., block_hashes: _Optional[_Iterable[int]] = ..., candidate_instances: _Optional[_Iterable[str]] = ..., lora: _Optional[str] = ...) -> None: ...

class TierMatch(_message.Message):
    __slots__ = ("tier", "blocks")
    TIER_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    tier: _common_pb2.Tier
    blocks: int
    def __init__(self, tier: _Optional[_Union[_common_pb2.Tier, str]] = ..., blocks: _Optional[int] = ...) -> None: ...

class InstanceMatch(_message.Message):
    __slots__ = ("instance_id", "matched_blocks", "tiers")
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    MATCHED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    TIERS_FIELD_NUMBER: _ClassVar[int]
    instance_id: str
    matched_blocks: int
    tiers: _containers.RepeatedCompositeFieldContainer[TierMatch]
    def __init__(self, instance_id: _Optional[str] = ..., matched_blocks: _Optional[int] = ..., tiers: _Optional[_Iterable[_Union[TierMatch, _Mapping]]] = ...) -> None: ...

class MatchPrefixResponse(_message.Message):
    __slots__ = ("matches", "block_size")
    MATCHES_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    matches: _containers.RepeatedCompositeFieldContainer[InstanceMatch]
    block_size: int
    def __init__(self, matches: _Optional[_Iterable[_Union[InstanceMatch, _Mapping]]] = ..., block_size: _Optional[int] = ...) -> None: ...

class IngestEventsResponse(_message.Message):
    __slots__ = ("batches_applied", "batches_skipped", "resync_requested")
    BATCHES_APPLIED_FIELD_NUMBER: _ClassVar[int]
    BATCHES_SKIPPED_FIELD_NUMBER: _ClassVar[int]
    RESYNC_REQUESTED_FIELD_NUMBER: _ClassVar[int]
    batches_applied: int
    batches_skipped: int
    resync_requested: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, batches_applied: _Optional[int] = ..., batches_skipped: _Optional[int] = ..., resync_requested: _Optional[_Iterable[str]] = ...) -> None: ...

class ListIndexedInstancesRequest(_message.Message):
    __slots__ = ("deployment",)
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    deployment: str
    def __init__(self, deployment: _Optional[str] = ...) -> None: ...

class IndexedInstance(_message.Message):
    __slots__ = ("instance_id", "epoch", "last_seq", "blocks", "stale", "last_seen_ms")
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQ_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    STALE_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_MS_FIELD_NUMBER: _ClassVar[int]
    instance_id: str
    epoch: int
    last_seq: int
    blocks: int
    stale: bool
    last_seen_ms: int
    def __init__(self, instance_id: _Optional[str] = ..., epoch: _Optional[int] = ..., last_seq: _Optional[int] = ..., blocks: _Optional[int] = ..., stale: _Optional[bool] = ..., last_seen_ms: _Optional[int] = ...) -> None: ...

class ListIndexedInstancesResponse(_message.Message):
    __slots__ = ("instances",)
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    instances: _containers.RepeatedCompositeFieldContainer[IndexedInstance]
    def __init__(self, instances: _Optional[_Iterable[_Union[IndexedInstance, _Mapping]]] = ...) -> None: ...

class Segment(_message.Message):
    __slots__ = ("name", "instance_id", "tier", "capacity_bytes", "used_bytes", "transfer_address", "base_address")
    NAME_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_BYTES_FIELD_NUMBER: _ClassVar[int]
    USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    BASE_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    name: str
    instance_id: str
    tier: _common_pb2.Tier
    capacity_bytes: int
    used_bytes: int
    transfer_address: str
    base_address: int
    def __init__(self, name: _Optional[str] = ..., instance_id: _Optional[str] = ..., tier: _Optional[_Union[_common_pb2.Tier, str]] = ..., capacity_bytes: _Optional[int] = ..., used_bytes: _Optional[int] = ..., transfer_address: _Optional[str] = ..., base_address: _Optional[int] = ...) -> None: ...

class MountSegmentRequest(_message.Message):
    __slots__ = ("deployment", "segment")
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_FIELD_NUMBER: _ClassVar[int]
    deployment: str
    segment: Segment
    def __init__(self, deployment: _Optional[str] = ..., segment: _Optional[_Union[Segment, _Mapping]] = ...) -> None: ...

class MountSegmentResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class UnmountSegmentRequest(_message.Message):
    __slots__ = ("deployment", "name")
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    deployment: str
    name: str
    def __init__(self, deployment: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class UnmountSegmentResponse(_message.Message):
    __slots__ = ("replicas_dropped",)
    REPLICAS_DROPPED_FIELD_NUMBER: _ClassVar[int]
    replicas_dropped: int
    def __init__(self, replicas_dropped: _Optional[int] = ...) -> None: ...

class ReplicaConfig(_message.Message):
    __slots__ = ("replica_num", "policy", "preferred_segment", "tier", "soft_pin", "hard_pin")
    REPLICA_NUM_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    PREFERRED_SEGMENT_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    SOFT_PIN_FIELD_NUMBER: _ClassVar[int]
    HARD_PIN_FIELD_NUMBER: _ClassVar[int]
    replica_num: int
    policy: str
    preferred_segment: str
    tier: _common_pb2.Tier
    soft_pin: bool
    hard_pin: bool
    def __init__(self, replica_num: _Optional[int] = ..., policy: _Optional[str] = ..., preferred_segment: _Optional[str] = ..., tier: _Optional[_Union[_common_pb2.Tier, str]] = ..., soft_pin: _Optional[bool] = ..., hard_pin: _Optional[bool] = ...) -> None: ...

class Replica(_message.Message):
    __slots__ = ("segment", "transfer_address", "tier", "offset", "size", "status")
    SEGMENT_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    segment: str
    transfer_address: str
    tier: _common_pb2.Tier
    offset: int
    size: int
    status: str
    def __init__(self, segment: _Optional[str] = ..., transfer_address: _Optional[str] = ..., tier: _Optional[_Union[_common_pb2.Tier, str]] = ..., offset: _Optional[int] = ..., size: _Optional[int] = ..., status: _Optional[str] = ...) -> None: ...

class PutStartRequest(_message.Message):
    __slots__ = ("deployment", "tenant", "key", "size", "config")
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    deployment: str
    tenant: str
    key: str
    size: int
    config: ReplicaConfig
    def __init__(self, deployment: _Optional[str] = ..., tenant: _Optional[str] = ..., key: _Optional[str] = ..., size: _Optional[int] = ..., config: _Optional[_Union[ReplicaConfig, _Mapping]] = ...) -> None: ...

class PutStartResponse(_message.Message):
    __slots__ = ("replicas",)
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    replicas: _containers.RepeatedCompositeFieldContainer[Replica]
    def __init__(self, replicas: _Optional[_Iterable[_Union[Replica, _Mapping]]] = ...) -> None: ...

class PutEndRequest(_message.Message):
    __slots__ = ("deployment", "tenant", "key")
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    deployment: str
    tenant: str
    key: str
    def __init__(self, deployment: _Optional[str] = ..., tenant: _Optional[str] = ..., key: _Optional[str] = ...) -> None: ...

class PutEndResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PutRevokeRequest(_message.Message):
    __slots__ = ("deployment", "tenant", "key")
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    deployment: str
    tenant: str
    key: str
    def __init__(self, deployment: _Optional[str] = ..., tenant: _Optional[str] = ..., key: _Optional[str] = ...) -> None: ...

class PutRevokeResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetReplicaListRequest(_message.Message):
    __slots__ = ("deployment", "tenant", "key")
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    deployment: str
    tenant: str
    key: str
    def __init__(self, deployment: _Optional[str] = ..., tenant: _Optional[str] = ..., key: _Optional[str] = ...) -> None: ...

class GetReplicaListResponse(_message.Message):
    __slots__ = ("replicas", "lease_expires_ms")
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    LEASE_EXPIRES_MS_FIELD_NUMBER: _ClassVar[int]
    replicas: _containers.RepeatedCompositeFieldContainer[Replica]
    lease_expires_ms: int
    def __init__(self, replicas: _Optional[_Iterable[_Union[Replica, _Mapping]]] = ..., lease_expires_ms: _Optional[int] = ...) -> None: ...

class RemoveRequest(_message.Message):
    __slots__ = ("deployment", "tenant", "key")
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    deployment: str
    tenant: str
    key: str
    def __init__(self, deployment: _Optional[str] = ..., tenant: _Optional[str] = ..., key: _Optional[str] = ...) -> None: ...

class RemoveResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ExistRequest(_message.Message):
    __slots__ = ("deployment", "tenant", "keys")
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    deployment: str
    tenant: str
    keys: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, deployment: _Optional[str] = ..., tenant: _Optional[str] = ..., keys: _Optional[_Iterable[str]] = ...) -> None: ...

class ExistResponse(_message.Message):
    __slots__ = ("exists",)
    EXISTS_FIELD_NUMBER: _ClassVar[int]
    exists: _containers.RepeatedScalarFieldContainer[bool]
    def __init__(self, exists: _Optional[_Iterable[bool]] = ...) -> None: ...

class BatchPutStartRequest(_message.Message):
    __slots__ = ("deployment", "tenant", "keys", "sizes", "config")
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    SIZES_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    deployment: str
    tenant: str
    keys: _containers.RepeatedScalarFieldContainer[str]
    sizes: _containers.RepeatedScalarFieldContainer[int]
    config: ReplicaConfig
    def __init__(self, deployment: _Optional[str] = ..., tenant: _Optional[str] = ..., keys: _Optional[_Iterable[str]] = ..., sizes: _Optional[_Iterable[int]] = ..., config: _Optional[_Union[ReplicaConfig, _Mapping]] = ...) -> None: ...

class KeyReplicas(_message.Message):
    __slots__ = ("key", "replicas", "error_code", "error")
    KEY_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    key: str
    replicas: _containers.RepeatedCompositeFieldContainer[Replica]
    error_code: str
    error: str
    def __init__(self, key: _Optional[str] = ..., replicas: _Optional[_Iterable[_Union[Replica, _Mapping]]] = ..., error_code: _Optional[str] = ..., error: _Optional[str] = ...) -> None: ...

class BatchPutStartResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[KeyReplicas]
    def __init__(self, results: _Optional[_Iterable[_Union[KeyReplicas, _Mapping]]] = ...) -> None: ...

class BatchPutEndRequest(_message.Message):
    __slots__ = ("deployment", "tenant", "keys")
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    deployment: str
    tenant: str
    keys: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, deployment: _Optional[str] = ..., tenant: _Optional[str] = ..., keys: _Optional[_Iterable[str]] = ...) -> None: ...

class BatchPutEndResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[KeyReplicas]
    def __init__(self, results: _Optional[_Iterable[_Union[KeyReplicas, _Mapping]]] = ...) -> None: ...

class BatchGetReplicaListRequest(_message.Message):
    __slots__ = ("deployment", "tenant", "keys")
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    deployment: str
    tenant: str
    keys: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, deployment: _Optional[str] = ..., tenant: _Optional[str] = ..., keys: _Optional[_Iterable[str]] = ...) -> None: ...

class BatchGetReplicaListResponse(_message.Message):
    __slots__ = ("results", "lease_expires_ms")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    LEASE_EXPIRES_MS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[KeyReplicas]
    lease_expires_ms: int
    def __init__(self, results: _Optional[_Iterable[_Union[KeyReplicas, _Mapping]]] = ..., lease_expires_ms: _Optional[int] = ...) -> None: ...

class AgentSession(_message.Message):
    __slots__ = ("session_id", "tenant", "parent_session_id", "agent", "phase", "tip_block_hash", "tip_tokens", "home_instance", "tiers", "turns", "turn_started_ms", "last_turn_end_ms", "tool_names", "predicted_return_ms", "prediction_samples", "prediction_source", "ended_ms", "updated_ms")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    PARENT_SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    TIP_BLOCK_HASH_FIELD_NUMBER: _ClassVar[int]
    TIP_TOKENS_FIELD_NUMBER: _ClassVar[int]
    HOME_INSTANCE_FIELD_NUMBER: _ClassVar[int]
    TIERS_FIELD_NUMBER: _ClassVar[int]
    TURNS_FIELD_NUMBER: _ClassVar[int]
    TURN_STARTED_MS_FIELD_NUMBER: _ClassVar[int]
    LAST_TURN_END_MS_FIELD_NUMBER: _ClassVar[int]
    TOOL_NAMES_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_RETURN_MS_FIELD_NUMBER: _ClassVar[int]
    PREDICTION_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    PREDICTION_SOURCE_FIELD_NUMBER: _ClassVar[int]
    ENDED_MS_FIELD_NUMBER: _ClassVar[int]
    UPDATED_MS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    tenant: str
    parent_session_id: str
    agent: str
    phase: SessionPhase
    tip_block_hash: int
    tip_tokens: int
    home_instance: str
    tiers: _containers.RepeatedCompositeFieldContainer[TierMatch]
    turns: int
    turn_started_ms: int
    last_turn_end_ms: int
    tool_names: _containers.RepeatedScalarFieldContainer[str]
    predicted_return_ms: int
    prediction_samples: int
    prediction_source: str
    ended_ms: int
    updated_ms: int
    def __init__(self, session_id: _Optional[str] = ..., tenant: _Optional[str] = ..., parent_session_id: _Optional[str] = ..., agent: _Optional[str] = ..., phase: _Optional[_Union[SessionPhase, str]] = ..., tip_block_hash: _Optional[int] = ..., tip_tokens: _Optional[int] = ..., home_instance: _Optional[str] = ..., tiers: _Optional[_Iterable[_Union[TierMatch, _Mapping]]] = ..., turns: _Optional[int] = ..., turn_started_ms: _Optional[int] = ..., last_turn_end_ms: _Optional[int] = ..., tool_names: _Optional[_Iterable[str]] = ..., predicted_return_ms: _Optional[int] = ..., prediction_samples: _Optional[int] = ..., prediction_source: _Optional[str] = ..., ended_ms: _Optional[int] = ..., updated_ms: _Optional[int] = ...) -> None: ...

class SessionResponse(_message.Message):
    __slots__ = ("session",)
    SESSION_FIELD_NUMBER: _ClassVar[int]
    session: AgentSession
    def __init__(self, session: _Optional[_Union[AgentSession, _Mapping]] = ...) -> None: ...

class StartSessionTurnRequest(_message.Message):
    __slots__ = ("deployment", "tenant", "session_id", "parent_session_id", "agent", "home_instance")
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    PARENT_SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_FIELD_NUMBER: _ClassVar[int]
    HOME_INSTANCE_FIELD_NUMBER: _ClassVar[int]
    deployment: str
    tenant: str
    session_id: str
    parent_session_id: str
    agent: str
    home_instance: str
    def __init__(self, deployment: _Optional[str] = ..., tenant: _Optional[str] = ..., session_id: _Optional[str] = ..., parent_session_id: _Optional[str] = ..., agent: _Optional[str] = ..., home_instance: _Optional[str] = ...) -> None: ...

class EndSessionTurnRequest(_message.Message):
    __slots__ = ("deployment", "tenant", "session_id", "tip_block_hash", "tip_tokens", "tool_names", "final", "home_instance", "block_hashes")
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TIP_BLOCK_HASH_FIELD_NUMBER: _ClassVar[int]
    TIP_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOOL_NAMES_FIELD_NUMBER: _ClassVar[int]
    FINAL_FIELD_NUMBER: _ClassVar[int]
    HOME_INSTANCE_FIELD_NUMBER: _ClassVar[int]
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    deployment: str
    tenant: str
    session_id: str
    tip_block_hash: int
    tip_tokens: int
    tool_names: _containers.RepeatedScalarFieldContainer[str]
    final: bool
    home_instance: str
    block_hashes: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, deployment: _Optional[str] = ..., tenant: _Optional[str] = ..., session_id: _Optional[str] = ..., tip_block_hash: _Optional[int] = ..., tip_tokens: _Optional[int] = ..., tool_names: _Optional[_Iterable[str]] = ..., final: _Optional[bool] = ..., home_instance: _Optional[str] = ..., block_hashes: _Optional[_Iterable[int]] = ...) -> None: ...

class SetSessionPlacementRequest(_message.Message):
    __slots__ = ("deployment", "tenant", "session_id", "home_instance", "tiers")
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    HOME_INSTANCE_FIELD_NUMBER: _ClassVar[int]
    TIERS_FIELD_NUMBER: _ClassVar[int]
    deployment: str
    tenant: str
    session_id: str
    home_instance: str
    tiers: _containers.RepeatedCompositeFieldContainer[TierMatch]
    def __init__(self, deployment: _Optional[str] = ..., tenant: _Optional[str] = ..., session_id: _Optional[str] = ..., home_instance: _Optional[str] = ..., tiers: _Optional[_Iterable[_Union[TierMatch, _Mapping]]] = ...) -> None: ...

class EndAgentSessionRequest(_message.Message):
    __slots__ = ("deployment", "tenant", "session_id")
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    deployment: str
    tenant: str
    session_id: str
    def __init__(self, deployment: _Optional[str] = ..., tenant: _Optional[str] = ..., session_id: _Optional[str] = ...) -> None: ...

class GetAgentSessionRequest(_message.Message):
    __slots__ = ("deployment", "tenant", "session_id")
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    deployment: str
    tenant: str
    session_id: str
    def __init__(self, deployment: _Optional[str] = ..., tenant: _Optional[str] = ..., session_id: _Optional[str] = ...) -> None: ...

class ListAgentSessionsRequest(_message.Message):
    __slots__ = ("deployment", "tenant", "phase", "home_instance", "limit")
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    HOME_INSTANCE_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    deployment: str
    tenant: str
    phase: SessionPhase
    home_instance: str
    limit: int
    def __init__(self, deployment: _Optional[str] = ..., tenant: _Optional[str] = ..., phase: _Optional[_Union[SessionPhase, str]] = ..., home_instance: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class ListAgentSessionsResponse(_message.Message):
    __slots__ = ("sessions",)
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    sessions: _containers.RepeatedCompositeFieldContainer[AgentSession]
    def __init__(self, sessions: _Optional[_Iterable[_Union[AgentSession, _Mapping]]] = ...) -> None: ...

class ListSessionHomesRequest(_message.Message):
    __slots__ = ("deployment",)
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    deployment: str
    def __init__(self, deployment: _Optional[str] = ...) -> None: ...

class SessionHome(_message.Message):
    __slots__ = ("instance_id", "sessions", "blocks", "tokens", "active_sessions", "active_blocks", "active_tokens")
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    instance_id: str
    sessions: int
    blocks: int
    tokens: int
    active_sessions: int
    active_blocks: int
    active_tokens: int
    def __init__(self, instance_id: _Optional[str] = ..., sessions: _Optional[int] = ..., blocks: _Optional[int] = ..., tokens: _Optional[int] = ..., active_sessions: _Optional[int] = ..., active_blocks: _Optional[int] = ..., active_tokens: _Optional[int] = ...) -> None: ...

class ListSessionHomesResponse(_message.Message):
    __slots__ = ("homes",)
    HOMES_FIELD_NUMBER: _ClassVar[int]
    homes: _containers.RepeatedCompositeFieldContainer[SessionHome]
    def __init__(self, homes: _Optional[_Iterable[_Union[SessionHome, _Mapping]]] = ...) -> None: ...

class MigrationDestination(_message.Message):
    __slots__ = ("instance_id", "url", "load")
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    URL_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    instance_id: str
    url: str
    load: float
    def __init__(self, instance_id: _Optional[str] = ..., url: _Optional[str] = ..., load: _Optional[float] = ...) -> None: ...

class MigrateSessionsRequest(_message.Message):
    __slots__ = ("deployment", "instance_id", "url", "destinations")
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    URL_FIELD_NUMBER: _ClassVar[int]
    DESTINATIONS_FIELD_NUMBER: _ClassVar[int]
    deployment: str
    instance_id: str
    url: str
    destinations: _containers.RepeatedCompositeFieldContainer[MigrationDestination]
    def __init__(self, deployment: _Optional[str] = ..., instance_id: _Optional[str] = ..., url: _Optional[str] = ..., destinations: _Optional[_Iterable[_Union[MigrationDestination, _Mapping]]] = ...) -> None: ...

class SessionMigration(_message.Message):
    __slots__ = ("tenant", "session_id", "fate", "instance_id", "blocks", "reason")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    FATE_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    session_id: str
    fate: MigrationFate
    instance_id: str
    blocks: int
    reason: str
    def __init__(self, tenant: _Optional[str] = ..., session_id: _Optional[str] = ..., fate: _Optional[_Union[MigrationFate, str]] = ..., instance_id: _Optional[str] = ..., blocks: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class MigrateSessionsResponse(_message.Message):
    __slots__ = ("sessions", "offload_requested", "offloaded", "offloads_to_tier", "engine_detail", "offload_settled", "prefetch_started")
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    OFFLOAD_REQUESTED_FIELD_NUMBER: _ClassVar[int]
    OFFLOADED_FIELD_NUMBER: _ClassVar[int]
    OFFLOADS_TO_TIER_FIELD_NUMBER: _ClassVar[int]
    ENGINE_DETAIL_FIELD_NUMBER: _ClassVar[int]
    OFFLOAD_SETTLED_FIELD_NUMBER: _ClassVar[int]
    PREFETCH_STARTED_FIELD_NUMBER: _ClassVar[int]
    sessions: _containers.RepeatedCompositeFieldContainer[SessionMigration]
    offload_requested: int
    offloaded: int
    offloads_to_tier: bool
    engine_detail: str
    offload_settled: bool
    prefetch_started: int
    def __init__(self, sessions: _Optional[_Iterable[_Union[SessionMigration, _Mapping]]] = ..., offload_requested: _Optional[int] = ..., offloaded: _Optional[int] = ..., offloads_to_tier: _Optional[bool] = ..., engine_detail: _Optional[str] = ..., offload_settled: _Optional[bool] = ..., prefetch_started: _Optional[int] = ...) -> None: ...
