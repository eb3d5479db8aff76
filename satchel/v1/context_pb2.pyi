import datetime

from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PacketStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PACKET_STATUS_UNSPECIFIED: _ClassVar[PacketStatus]
    PACKET_STATUS_OK: _ClassVar[PacketStatus]
    PACKET_STATUS_DEGRADED: _ClassVar[PacketStatus]

class CandidateKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CANDIDATE_KIND_UNSPECIFIED: _ClassVar[CandidateKind]
    CANDIDATE_KIND_FACT: _ClassVar[CandidateKind]
    CANDIDATE_KIND_EPISODE: _ClassVar[CandidateKind]

class DecisionOutcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DECISION_OUTCOME_UNSPECIFIED: _ClassVar[DecisionOutcome]
    DECISION_OUTCOME_INCLUDED: _ClassVar[DecisionOutcome]
    DECISION_OUTCOME_EXCLUDED: _ClassVar[DecisionOutcome]
    DECISION_OUTCOME_BLOCKED: _ClassVar[DecisionOutcome]

class ReasonCode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REASON_CODE_UNSPECIFIED: _ClassVar[ReasonCode]
    REASON_CODE_RELEVANCE: _ClassVar[ReasonCode]
    REASON_CODE_MULTI_HOP_EXPANSION: _ClassVar[ReasonCode]
    REASON_CODE_OVER_BUDGET: _ClassVar[ReasonCode]
    REASON_CODE_BELOW_RELEVANCE_FLOOR: _ClassVar[ReasonCode]
    REASON_CODE_CONFLICT_OPEN: _ClassVar[ReasonCode]
    REASON_CODE_VOLATILITY_EXPIRED: _ClassVar[ReasonCode]
    REASON_CODE_SOURCE_ALREADY_SERVED: _ClassVar[ReasonCode]
    REASON_CODE_SOURCE_FACTS_HIDDEN: _ClassVar[ReasonCode]
PACKET_STATUS_UNSPECIFIED: PacketStatus
PACKET_STATUS_OK: PacketStatus
PACKET_STATUS_DEGRADED: PacketStatus
CANDIDATE_KIND_UNSPECIFIED: CandidateKind
CANDIDATE_KIND_FACT: CandidateKind
CANDIDATE_KIND_EPISODE: CandidateKind
DECISION_OUTCOME_UNSPECIFIED: DecisionOutcome
DECISION_OUTCOME_INCLUDED: DecisionOutcome
DECISION_OUTCOME_EXCLUDED: DecisionOutcome
DECISION_OUTCOME_BLOCKED: DecisionOutcome
REASON_CODE_UNSPECIFIED: ReasonCode
REASON_CODE_RELEVANCE: ReasonCode
REASON_CODE_MULTI_HOP_EXPANSION: ReasonCode
REASON_CODE_OVER_BUDGET: ReasonCode
REASON_CODE_BELOW_RELEVANCE_FLOOR: ReasonCode
REASON_CODE_CONFLICT_OPEN: ReasonCode
REASON_CODE_VOLATILITY_EXPIRED: ReasonCode
REASON_CODE_SOURCE_ALREADY_SERVED: ReasonCode
REASON_CODE_SOURCE_FACTS_HIDDEN: ReasonCode

class PacketFact(_message.Message):
    __slots__ = ("id", "predicate", "value", "statement", "confidence", "valid_from", "source_event_ids")
    ID_FIELD_NUMBER: _ClassVar[int]
    PREDICATE_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    STATEMENT_FIELD_NUMBER: _ClassVar[int]
    CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    VALID_FROM_FIELD_NUMBER: _ClassVar[int]
    SOURCE_EVENT_IDS_FIELD_NUMBER: _ClassVar[int]
    id: str
    predicate: str
    value: _struct_pb2.Value
    statement: str
    confidence: float
    valid_from: _timestamp_pb2.Timestamp
    source_event_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, id: _Optional[str] = ..., predicate: _Optional[str] = ..., value: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., statement: _Optional[str] = ..., confidence: _Optional[float] = ..., valid_from: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., source_event_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class PacketEpisode(_message.Message):
    __slots__ = ("event_id", "kind", "occurred_at", "excerpt")
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    OCCURRED_AT_FIELD_NUMBER: _ClassVar[int]
    EXCERPT_FIELD_NUMBER: _ClassVar[int]
    event_id: str
    kind: str
    occurred_at: _timestamp_pb2.Timestamp
    excerpt: str
    def __init__(self, event_id: _Optional[str] = ..., kind: _Optional[str] = ..., occurred_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., excerpt: _Optional[str] = ...) -> None: ...

class ContextPacket(_message.Message):
    __slots__ = ("facts", "episodes", "warnings", "status", "empty_reason", "budget_tokens", "tokens_used", "block", "token_counter")
    FACTS_FIELD_NUMBER: _ClassVar[int]
    EPISODES_FIELD_NUMBER: _ClassVar[int]
    WARNINGS_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    EMPTY_REASON_FIELD_NUMBER: _ClassVar[int]
    BUDGET_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_USED_FIELD_NUMBER: _ClassVar[int]
    BLOCK_FIELD_NUMBER: _ClassVar[int]
    TOKEN_COUNTER_FIELD_NUMBER: _ClassVar[int]
    facts: _containers.RepeatedCompositeFieldContainer[PacketFact]
    episodes: _containers.RepeatedCompositeFieldContainer[PacketEpisode]
    warnings: _containers.RepeatedScalarFieldContainer[str]
    status: PacketStatus
    empty_reason: str
    budget_tokens: int
    tokens_used: int
    block: str
    token_counter: str
    def __init__(self, facts: _Optional[_Iterable[_Union[PacketFact, _Mapping]]] = ..., episodes: _Optional[_Iterable[_Union[PacketEpisode, _Mapping]]] = ..., warnings: _Optional[_Iterable[str]] = ..., status: _Optional[_Union[PacketStatus, str]] = ..., empty_reason: _Optional[str] = ..., budget_tokens: _Optional[int] = ..., tokens_used: _Optional[int] = ..., block: _Optional[str] = ..., token_counter: _Optional[str] = ...) -> None: ...

class Decision(_message.Message):
    __slots__ = ("sequence", "candidate_id", "candidate_kind", "outcome", "reason_code", "score", "similarity", "text_rank", "recency", "tokens", "budget_used", "preview", "reason")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_ID_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_KIND_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    REASON_CODE_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    SIMILARITY_FIELD_NUMBER: _ClassVar[int]
    TEXT_RANK_FIELD_NUMBER: _ClassVar[int]
    RECENCY_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    BUDGET_USED_FIELD_NUMBER: _ClassVar[int]
    PREVIEW_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    candidate_id: str
    candidate_kind: CandidateKind
    outcome: DecisionOutcome
    reason_code: str
    score: float
    similarity: float
    text_rank: float
    recency: float
    tokens: int
    budget_used: int
    preview: str
    reason: ReasonCode
    def __init__(self, sequence: _Optional[int] = ..., candidate_id: _Optional[str] = ..., candidate_kind: _Optional[_Union[CandidateKind, str]] = ..., outcome: _Optional[_Union[DecisionOutcome, str]] = ..., reason_code: _Optional[str] = ..., score: _Optional[float] = ..., similarity: _Optional[float] = ..., text_rank: _Optional[float] = ..., recency: _Optional[float] = ..., tokens: _Optional[int] = ..., budget_used: _Optional[int] = ..., preview: _Optional[str] = ..., reason: _Optional[_Union[ReasonCode, str]] = ...) -> None: ...

class TraceTimings(_message.Message):
    __slots__ = ("embed_ms", "retrieve_ms", "pack_ms", "total_ms")
    EMBED_MS_FIELD_NUMBER: _ClassVar[int]
    RETRIEVE_MS_FIELD_NUMBER: _ClassVar[int]
    PACK_MS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_MS_FIELD_NUMBER: _ClassVar[int]
    embed_ms: float
    retrieve_ms: float
    pack_ms: float
    total_ms: float
    def __init__(self, embed_ms: _Optional[float] = ..., retrieve_ms: _Optional[float] = ..., pack_ms: _Optional[float] = ..., total_ms: _Optional[float] = ...) -> None: ...

class Trace(_message.Message):
    __slots__ = ("trace_id", "project_id", "subject_id", "query", "budget_tokens", "created_at", "decisions", "status", "warnings", "empty_reason", "timings", "as_of", "tokens_used")
    TRACE_ID_FIELD_NUMBER: _ClassVar[int]
    PROJECT_ID_FIELD_NUMBER: _ClassVar[int]
    SUBJECT_ID_FIELD_NUMBER: _ClassVar[int]
    QUERY_FIELD_NUMBER: _ClassVar[int]
    BUDGET_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    DECISIONS_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    WARNINGS_FIELD_NUMBER: _ClassVar[int]
    EMPTY_REASON_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    AS_OF_FIELD_NUMBER: _ClassVar[int]
    TOKENS_USED_FIELD_NUMBER: _ClassVar[int]
    trace_id: str
    project_id: str
    subject_id: str
    query: str
    budget_tokens: int
    created_at: _timestamp_pb2.Timestamp
    decisions: _containers.RepeatedCompositeFieldContainer[Decision]
    status: PacketStatus
    warnings: _containers.RepeatedScalarFieldContainer[str]
    empty_reason: str
    timings: TraceTimings
    as_of: _timestamp_pb2.Timestamp
    tokens_used: int
    def __init__(self, trace_id: _Optional[str] = ..., project_id: _Optional[str] = ..., subject_id: _Optional[str] = ..., query: _Optional[str] = ..., budget_tokens: _Optional[int] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., decisions: _Optional[_Iterable[_Union[Decision, _Mapping]]] = ..., status: _Optional[_Union[PacketStatus, str]] = ..., warnings: _Optional[_Iterable[str]] = ..., empty_reason: _Optional[str] = ..., timings: _Optional[_Union[TraceTimings, _Mapping]] = ..., as_of: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., tokens_used: _Optional[int] = ...) -> None: ...

class AssembleContextRequest(_message.Message):
    __slots__ = ("project_id", "subject_id", "query", "budget_tokens", "as_of", "max_distance", "min_consistency_token")
    PROJECT_ID_FIELD_NUMBER: _ClassVar[int]
    SUBJECT_ID_FIELD_NUMBER: _ClassVar[int]
    QUERY_FIELD_NUMBER: _ClassVar[int]
    BUDGET_TOKENS_FIELD_NUMBER: _ClassVar[int]
    AS_OF_FIELD_NUMBER: _ClassVar[int]
    MAX_DISTANCE_FIELD_NUMBER: _ClassVar[int]
    MIN_CONSISTENCY_TOKEN_FIELD_NUMBER: _ClassVar[int]
    project_id: str
    subject_id: str
    query: str
    budget_tokens: int
    as_of: _timestamp_pb2.Timestamp
    max_distance: float
    min_consistency_token: str
    def __init__(self, project_id: _Optional[str] = ..., subject_id: _Optional[str] = ..., query: _Optional[str] = ..., budget_tokens: _Optional[int] = ..., as_of: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., max_distance: _Optional[float] = ..., min_consistency_token: _Optional[str] = ...) -> None: ...

class AssembleContextResponse(_message.Message):
    __slots__ = ("packet", "trace_id")
    PACKET_FIELD_NUMBER: _ClassVar[int]
    TRACE_ID_FIELD_NUMBER: _ClassVar[int]
    packet: ContextPacket
    trace_id: str
    def __init__(self, packet: _Optional[_Union[ContextPacket, _Mapping]] = ..., trace_id: _Optional[str] = ...) -> None: ...

class StreamContextRequest(_message.Message):
    __slots__ = ("project_id", "subject_id", "query", "budget_tokens", "as_of", "max_distance", "max_decisions_per_message", "min_consistency_token")
    PROJECT_ID_FIELD_NUMBER: _ClassVar[int]
    SUBJECT_ID_FIELD_NUMBER: _ClassVar[int]
    QUERY_FIELD_NUMBER: _ClassVar[int]
    BUDGET_TOKENS_FIELD_NUMBER: _ClassVar[int]
    AS_OF_FIELD_NUMBER: _ClassVar[int]
    MAX_DISTANCE_FIELD_NUMBER: _ClassVar[int]
    MAX_DECISIONS_PER_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    MIN_CONSISTENCY_TOKEN_FIELD_NUMBER: _ClassVar[int]
    project_id: str
    subject_id: str
    query: str
    budget_tokens: int
    as_of: _timestamp_pb2.Timestamp
    max_distance: float
    max_decisions_per_message: int
    min_consistency_token: str
    def __init__(self, project_id: _Optional[str] = ..., subject_id: _Optional[str] = ..., query: _Optional[str] = ..., budget_tokens: _Optional[int] = ..., as_of: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., max_distance: _Optional[float] = ..., max_decisions_per_message: _Optional[int] = ..., min_consistency_token: _Optional[str] = ...) -> None: ...

class DecisionBatch(_message.Message):
    __slots__ = ("decisions",)
    DECISIONS_FIELD_NUMBER: _ClassVar[int]
    decisions: _containers.RepeatedCompositeFieldContainer[Decision]
    def __init__(self, decisions: _Optional[_Iterable[_Union[Decision, _Mapping]]] = ...) -> None: ...

class StreamContextResponse(_message.Message):
    __slots__ = ("trace_id", "decision", "packet", "decisions")
    TRACE_ID_FIELD_NUMBER: _ClassVar[int]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    PACKET_FIELD_NUMBER: _ClassVar[int]
    DECISIONS_FIELD_NUMBER: _ClassVar[int]
    trace_id: str
    decision: Decision
    packet: ContextPacket
    decisions: DecisionBatch
    def __init__(self, trace_id: _Optional[str] = ..., decision: _Optional[_Union[Decision, _Mapping]] = ..., packet: _Optional[_Union[ContextPacket, _Mapping]] = ..., decisions: _Optional[_Union[DecisionBatch, _Mapping]] = ...) -> None: ...

class GetTraceRequest(_message.Message):
    __slots__ = ("project_id", "trace_id")
    PROJECT_ID_FIELD_NUMBER: _ClassVar[int]
    TRACE_ID_FIELD_NUMBER: _ClassVar[int]
    project_id: str
    trace_id: str
    def __init__(self, project_id: _Optional[str] = ..., trace_id: _Optional[str] = ...) -> None: ...

class GetTraceResponse(_message.Message):
    __slots__ = ("trace",)
    TRACE_FIELD_NUMBER: _ClassVar[int]
    trace: Trace
    def __init__(self, trace: _Optional[_Union[Trace, _Mapping]] = ...) -> None: ...

class WatchTracesRequest(_message.Message):
    __slots__ = ("project_id", "subject_id")
    PROJECT_ID_FIELD_NUMBER: _ClassVar[int]
    SUBJECT_ID_FIELD_NUMBER: _ClassVar[int]
    project_id: str
    subject_id: str
    def __init__(self, project_id: _Optional[str] = ..., subject_id: _Optional[str] = ...) -> None: ...

class WatchTracesResponse(_message.Message):
    __slots__ = ("trace_id", "subject_id", "decision", "packet", "dropped_traces")
    TRACE_ID_FIELD_NUMBER: _ClassVar[int]
    SUBJECT_ID_FIELD_NUMBER: _ClassVar[int]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    PACKET_FIELD_NUMBER: _ClassVar[int]
    DROPPED_TRACES_FIELD_NUMBER: _ClassVar[int]
    trace_id: str
    subject_id: str
    decision: Decision
    packet: ContextPacket
    dropped_traces: int
    def __init__(self, trace_id: _Optional[str] = ..., subject_id: _Optional[str] = ..., decision: _Optional[_Union[Decision, _Mapping]] = ..., packet: _Optional[_Union[ContextPacket, _Mapping]] = ..., dropped_traces: _Optional[int] = ...) -> None: ...

class GetStatsOverviewRequest(_message.Message):
    __slots__ = ("project_id",)
    PROJECT_ID_FIELD_NUMBER: _ClassVar[int]
    project_id: str
    def __init__(self, project_id: _Optional[str] = ...) -> None: ...

class GetStatsOverviewResponse(_message.Message):
    __slots__ = ("injection_rate", "hit_rate", "context_calls", "calls_serving_facts", "calls_empty", "latency_p50_ms", "latency_p95_ms", "latency_p99_ms", "mean_tokens_used")
    INJECTION_RATE_FIELD_NUMBER: _ClassVar[int]
    HIT_RATE_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_CALLS_FIELD_NUMBER: _ClassVar[int]
    CALLS_SERVING_FACTS_FIELD_NUMBER: _ClassVar[int]
    CALLS_EMPTY_FIELD_NUMBER: _ClassVar[int]
    LATENCY_P50_MS_FIELD_NUMBER: _ClassVar[int]
    LATENCY_P95_MS_FIELD_NUMBER: _ClassVar[int]
    LATENCY_P99_MS_FIELD_NUMBER: _ClassVar[int]
    MEAN_TOKENS_USED_FIELD_NUMBER: _ClassVar[int]
    injection_rate: float
    hit_rate: float
    context_calls: int
    calls_serving_facts: int
    calls_empty: int
    latency_p50_ms: float
    latency_p95_ms: float
    latency_p99_ms: float
    mean_tokens_used: float
    def __init__(self, injection_rate: _Optional[float] = ..., hit_rate: _Optional[float] = ..., context_calls: _Optional[int] = ..., calls_serving_facts: _Optional[int] = ..., calls_empty: _Optional[int] = ..., latency_p50_ms: _Optional[float] = ..., latency_p95_ms: _Optional[float] = ..., latency_p99_ms: _Optional[float] = ..., mean_tokens_used: _Optional[float] = ...) -> None: ...
