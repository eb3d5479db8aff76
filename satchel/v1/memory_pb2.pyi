import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FactStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FACT_STATUS_UNSPECIFIED: _ClassVar[FactStatus]
    FACT_STATUS_ACTIVE: _ClassVar[FactStatus]
    FACT_STATUS_RETIRED: _ClassVar[FactStatus]
    FACT_STATUS_SUPERSEDED: _ClassVar[FactStatus]

class ConflictStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CONFLICT_STATUS_UNSPECIFIED: _ClassVar[ConflictStatus]
    CONFLICT_STATUS_OPEN: _ClassVar[ConflictStatus]
    CONFLICT_STATUS_RESOLVED: _ClassVar[ConflictStatus]
FACT_STATUS_UNSPECIFIED: FactStatus
FACT_STATUS_ACTIVE: FactStatus
FACT_STATUS_RETIRED: FactStatus
FACT_STATUS_SUPERSEDED: FactStatus
CONFLICT_STATUS_UNSPECIFIED: ConflictStatus
CONFLICT_STATUS_OPEN: ConflictStatus
CONFLICT_STATUS_RESOLVED: ConflictStatus

class Event(_message.Message):
    __slots__ = ("id", "project_id", "subject_id", "kind", "payload", "occurred_at", "recorded_at", "text")
    ID_FIELD_NUMBER: _ClassVar[int]
    PROJECT_ID_FIELD_NUMBER: _ClassVar[int]
    SUBJECT_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    OCCURRED_AT_FIELD_NUMBER: _ClassVar[int]
    RECORDED_AT_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    id: str
    project_id: str
    subject_id: str
    kind: str
    payload: _struct_pb2.Struct
    occurred_at: _timestamp_pb2.Timestamp
    recorded_at: _timestamp_pb2.Timestamp
    text: str
    def __init__(self, id: _Optional[str] = ..., project_id: _Optional[str] = ..., subject_id: _Optional[str] = ..., kind: _Optional[str] = ..., payload: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., occurred_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., recorded_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., text: _Optional[str] = ...) -> None: ...

class Fact(_message.Message):
    __slots__ = ("id", "project_id", "subject_id", "predicate", "value", "statement", "confidence", "status", "valid_from", "valid_to", "recorded_from", "source_event_ids", "stale_after", "superseded_by", "status_reason", "recorded_to")
    ID_FIELD_NUMBER: _ClassVar[int]
    PROJECT_ID_FIELD_NUMBER: _ClassVar[int]
    SUBJECT_ID_FIELD_NUMBER: _ClassVar[int]
    PREDICATE_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    STATEMENT_FIELD_NUMBER: _ClassVar[int]
    CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    VALID_FROM_FIELD_NUMBER: _ClassVar[int]
    VALID_TO_FIELD_NUMBER: _ClassVar[int]
    RECORDED_FROM_FIELD_NUMBER: _ClassVar[int]
    SOURCE_EVENT_IDS_FIELD_NUMBER: _ClassVar[int]
    STALE_AFTER_FIELD_NUMBER: _ClassVar[int]
    SUPERSEDED_BY_FIELD_NUMBER: _ClassVar[int]
    STATUS_REASON_FIELD_NUMBER: _ClassVar[int]
    RECORDED_TO_FIELD_NUMBER: _ClassVar[int]
    id: str
    project_id: str
    subject_id: str
    predicate: str
    value: _struct_pb2.Value
    statement: str
    confidence: float
    status: FactStatus
    valid_from: _timestamp_pb2.Timestamp
    valid_to: _timestamp_pb2.Timestamp
    recorded_from: _timestamp_pb2.Timestamp
    source_event_ids: _containers.RepeatedScalarFieldContainer[str]
    stale_after: _duration_pb2.Duration
    superseded_by: str
    status_reason: str
    recorded_to: _timestamp_pb2.Timestamp
    def __init__(self, id: _Optional[str] = ..., project_id: _Optional[str] = ..., subject_id: _Optional[str] = ..., predicate: _Optional[str] = ..., value: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., statement: _Optional[str] = ..., confidence: _Optional[float] = ..., status: _Optional[_Union[FactStatus, str]] = ..., valid_from: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., valid_to: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., recorded_from: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., source_event_ids: _Optional[_Iterable[str]] = ..., stale_after: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., superseded_by: _Optional[str] = ..., status_reason: _Optional[str] = ..., recorded_to: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class Conflict(_message.Message):
    __slots__ = ("id", "project_id", "subject_id", "fact_ids", "status", "note", "opened_at", "resolved_at", "winning_fact_id")
    ID_FIELD_NUMBER: _ClassVar[int]
    PROJECT_ID_FIELD_NUMBER: _ClassVar[int]
    SUBJECT_ID_FIELD_NUMBER: _ClassVar[int]
    FACT_IDS_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    OPENED_AT_FIELD_NUMBER: _ClassVar[int]
    RESOLVED_AT_FIELD_NUMBER: _ClassVar[int]
    WINNING_FACT_ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    project_id: str
    subject_id: str
    fact_ids: _containers.RepeatedScalarFieldContainer[str]
    status: ConflictStatus
    note: str
    opened_at: _timestamp_pb2.Timestamp
    resolved_at: _timestamp_pb2.Timestamp
    winning_fact_id: str
    def __init__(self, id: _Optional[str] = ..., project_id: _Optional[str] = ..., subject_id: _Optional[str] = ..., fact_ids: _Optional[_Iterable[str]] = ..., status: _Optional[_Union[ConflictStatus, str]] = ..., note: _Optional[str] = ..., opened_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., resolved_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., winning_fact_id: _Optional[str] = ...) -> None: ...

class RecordEventRequest(_message.Message):
    __slots__ = ("project_id", "subject_id", "kind", "payload", "occurred_at", "idempotency_key")
    PROJECT_ID_FIELD_NUMBER: _ClassVar[int]
    SUBJECT_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    OCCURRED_AT_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    project_id: str
    subject_id: str
    kind: str
    payload: _struct_pb2.Struct
    occurred_at: _timestamp_pb2.Timestamp
    idempotency_key: str
    def __init__(self, project_id: _Optional[str] = ..., subject_id: _Optional[str] = ..., kind: _Optional[str] = ..., payload: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., occurred_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., idempotency_key: _Optional[str] = ...) -> None: ...

class RecordEventResponse(_message.Message):
    __slots__ = ("event", "created", "consistency_token")
    EVENT_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    CONSISTENCY_TOKEN_FIELD_NUMBER: _ClassVar[int]
    event: Event
    created: bool
    consistency_token: str
    def __init__(self, event: _Optional[_Union[Event, _Mapping]] = ..., created: _Optional[bool] = ..., consistency_token: _Optional[str] = ...) -> None: ...

class BatchRecordEventsRequest(_message.Message):
    __slots__ = ("requests",)
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    requests: _containers.RepeatedCompositeFieldContainer[RecordEventRequest]
    def __init__(self, requests: _Optional[_Iterable[_Union[RecordEventRequest, _Mapping]]] = ...) -> None: ...

class BatchRecordEventsResponse(_message.Message):
    __slots__ = ("events", "consistency_token")
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    CONSISTENCY_TOKEN_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[Event]
    consistency_token: str
    def __init__(self, events: _Optional[_Iterable[_Union[Event, _Mapping]]] = ..., consistency_token: _Optional[str] = ...) -> None: ...

class ListEventsRequest(_message.Message):
    __slots__ = ("project_id", "subject_id", "page_size", "page_token", "as_of", "min_consistency_token")
    PROJECT_ID_FIELD_NUMBER: _ClassVar[int]
    SUBJECT_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    AS_OF_FIELD_NUMBER: _ClassVar[int]
    MIN_CONSISTENCY_TOKEN_FIELD_NUMBER: _ClassVar[int]
    project_id: str
    subject_id: str
    page_size: int
    page_token: str
    as_of: _timestamp_pb2.Timestamp
    min_consistency_token: str
    def __init__(self, project_id: _Optional[str] = ..., subject_id: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., as_of: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., min_consistency_token: _Optional[str] = ...) -> None: ...

class ListEventsResponse(_message.Message):
    __slots__ = ("events", "next_page_token")
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[Event]
    next_page_token: str
    def __init__(self, events: _Optional[_Iterable[_Union[Event, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class AssertFactRequest(_message.Message):
    __slots__ = ("project_id", "subject_id", "predicate", "value", "statement", "confidence", "valid_from", "valid_to", "source_event_ids", "stale_after", "idempotency_key", "supersedes_fact_ids")
    PROJECT_ID_FIELD_NUMBER: _ClassVar[int]
    SUBJECT_ID_FIELD_NUMBER: _ClassVar[int]
    PREDICATE_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    STATEMENT_FIELD_NUMBER: _ClassVar[int]
    CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    VALID_FROM_FIELD_NUMBER: _ClassVar[int]
    VALID_TO_FIELD_NUMBER: _ClassVar[int]
    SOURCE_EVENT_IDS_FIELD_NUMBER: _ClassVar[int]
    STALE_AFTER_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    SUPERSEDES_FACT_IDS_FIELD_NUMBER: _ClassVar[int]
    project_id: str
    subject_id: str
    predicate: str
    value: _struct_pb2.Value
    statement: str
    confidence: float
    valid_from: _timestamp_pb2.Timestamp
    valid_to: _timestamp_pb2.Timestamp
    source_event_ids: _containers.RepeatedScalarFieldContainer[str]
    stale_after: _duration_pb2.Duration
    idempotency_key: str
    supersedes_fact_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, project_id: _Optional[str] = ..., subject_id: _Optional[str] = ..., predicate: _Optional[str] = ..., value: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., statement: _Optional[str] = ..., confidence: _Optional[float] = ..., valid_from: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., valid_to: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., source_event_ids: _Optional[_Iterable[str]] = ..., stale_after: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., idempotency_key: _Optional[str] = ..., supersedes_fact_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class AssertFactResponse(_message.Message):
    __slots__ = ("fact", "created", "consistency_token")
    FACT_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    CONSISTENCY_TOKEN_FIELD_NUMBER: _ClassVar[int]
    fact: Fact
    created: bool
    consistency_token: str
    def __init__(self, fact: _Optional[_Union[Fact, _Mapping]] = ..., created: _Optional[bool] = ..., consistency_token: _Optional[str] = ...) -> None: ...

class BatchAssertFactsRequest(_message.Message):
    __slots__ = ("requests",)
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    requests: _containers.RepeatedCompositeFieldContainer[AssertFactRequest]
    def __init__(self, requests: _Optional[_Iterable[_Union[AssertFactRequest, _Mapping]]] = ...) -> None: ...

class BatchAssertFactsResponse(_message.Message):
    __slots__ = ("facts", "consistency_token")
    FACTS_FIELD_NUMBER: _ClassVar[int]
    CONSISTENCY_TOKEN_FIELD_NUMBER: _ClassVar[int]
    facts: _containers.RepeatedCompositeFieldContainer[Fact]
    consistency_token: str
    def __init__(self, facts: _Optional[_Iterable[_Union[Fact, _Mapping]]] = ..., consistency_token: _Optional[str] = ...) -> None: ...

class RetireFactRequest(_message.Message):
    __slots__ = ("project_id", "fact_id", "reason")
    PROJECT_ID_FIELD_NUMBER: _ClassVar[int]
    FACT_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    project_id: str
    fact_id: str
    reason: str
    def __init__(self, project_id: _Optional[str] = ..., fact_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class RetireFactResponse(_message.Message):
    __slots__ = ("fact", "consistency_token")
    FACT_FIELD_NUMBER: _ClassVar[int]
    CONSISTENCY_TOKEN_FIELD_NUMBER: _ClassVar[int]
    fact: Fact
    consistency_token: str
    def __init__(self, fact: _Optional[_Union[Fact, _Mapping]] = ..., consistency_token: _Optional[str] = ...) -> None: ...

class SupersedeFactRequest(_message.Message):
    __slots__ = ("project_id", "fact_id", "superseded_by_fact_id")
    PROJECT_ID_FIELD_NUMBER: _ClassVar[int]
    FACT_ID_FIELD_NUMBER: _ClassVar[int]
    SUPERSEDED_BY_FACT_ID_FIELD_NUMBER: _ClassVar[int]
    project_id: str
    fact_id: str
    superseded_by_fact_id: str
    def __init__(self, project_id: _Optional[str] = ..., fact_id: _Optional[str] = ..., superseded_by_fact_id: _Optional[str] = ...) -> None: ...

class SupersedeFactResponse(_message.Message):
    __slots__ = ("fact", "consistency_token")
    FACT_FIELD_NUMBER: _ClassVar[int]
    CONSISTENCY_TOKEN_FIELD_NUMBER: _ClassVar[int]
    fact: Fact
    consistency_token: str
    def __init__(self, fact: _Optional[_Union[Fact, _Mapping]] = ..., consistency_token: _Optional[str] = ...) -> None: ...

class ListFactsRequest(_message.Message):
    __slots__ = ("project_id", "subject_id", "as_of", "include_inactive", "page_size", "page_token", "min_consistency_token")
    PROJECT_ID_FIELD_NUMBER: _ClassVar[int]
    SUBJECT_ID_FIELD_NUMBER: _ClassVar[int]
    AS_OF_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_INACTIVE_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    MIN_CONSISTENCY_TOKEN_FIELD_NUMBER: _ClassVar[int]
    project_id: str
    subject_id: str
    as_of: _timestamp_pb2.Timestamp
    include_inactive: bool
    page_size: int
    page_token: str
    min_consistency_token: str
    def __init__(self, project_id: _Optional[str] = ..., subject_id: _Optional[str] = ..., as_of: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., include_inactive: _Optional[bool] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., min_consistency_token: _Optional[str] = ...) -> None: ...

class ListFactsResponse(_message.Message):
    __slots__ = ("facts", "next_page_token")
    FACTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    facts: _containers.RepeatedCompositeFieldContainer[Fact]
    next_page_token: str
    def __init__(self, facts: _Optional[_Iterable[_Union[Fact, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class OpenConflictRequest(_message.Message):
    __slots__ = ("project_id", "subject_id", "fact_ids", "note")
    PROJECT_ID_FIELD_NUMBER: _ClassVar[int]
    SUBJECT_ID_FIELD_NUMBER: _ClassVar[int]
    FACT_IDS_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    project_id: str
    subject_id: str
    fact_ids: _containers.RepeatedScalarFieldContainer[str]
    note: str
    def __init__(self, project_id: _Optional[str] = ..., subject_id: _Optional[str] = ..., fact_ids: _Optional[_Iterable[str]] = ..., note: _Optional[str] = ...) -> None: ...

class OpenConflictResponse(_message.Message):
    __slots__ = ("conflict", "consistency_token")
    CONFLICT_FIELD_NUMBER: _ClassVar[int]
    CONSISTENCY_TOKEN_FIELD_NUMBER: _ClassVar[int]
    conflict: Conflict
    consistency_token: str
    def __init__(self, conflict: _Optional[_Union[Conflict, _Mapping]] = ..., consistency_token: _Optional[str] = ...) -> None: ...

class ResolveConflictRequest(_message.Message):
    __slots__ = ("project_id", "conflict_id", "winning_fact_id")
    PROJECT_ID_FIELD_NUMBER: _ClassVar[int]
    CONFLICT_ID_FIELD_NUMBER: _ClassVar[int]
    WINNING_FACT_ID_FIELD_NUMBER: _ClassVar[int]
    project_id: str
    conflict_id: str
    winning_fact_id: str
    def __init__(self, project_id: _Optional[str] = ..., conflict_id: _Optional[str] = ..., winning_fact_id: _Optional[str] = ...) -> None: ...

class ResolveConflictResponse(_message.Message):
    __slots__ = ("conflict", "consistency_token")
    CONFLICT_FIELD_NUMBER: _ClassVar[int]
    CONSISTENCY_TOKEN_FIELD_NUMBER: _ClassVar[int]
    conflict: Conflict
    consistency_token: str
    def __init__(self, conflict: _Optional[_Union[Conflict, _Mapping]] = ..., consistency_token: _Optional[str] = ...) -> None: ...

class ListConflictsRequest(_message.Message):
    __slots__ = ("project_id", "subject_id", "include_resolved", "page_size", "page_token", "min_consistency_token")
    PROJECT_ID_FIELD_NUMBER: _ClassVar[int]
    SUBJECT_ID_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_RESOLVED_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    MIN_CONSISTENCY_TOKEN_FIELD_NUMBER: _ClassVar[int]
    project_id: str
    subject_id: str
    include_resolved: bool
    page_size: int
    page_token: str
    min_consistency_token: str
    def __init__(self, project_id: _Optional[str] = ..., subject_id: _Optional[str] = ..., include_resolved: _Optional[bool] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., min_consistency_token: _Optional[str] = ...) -> None: ...

class ListConflictsResponse(_message.Message):
    __slots__ = ("conflicts", "next_page_token")
    CONFLICTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    conflicts: _containers.RepeatedCompositeFieldContainer[Conflict]
    next_page_token: str
    def __init__(self, conflicts: _Optional[_Iterable[_Union[Conflict, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class DeletedCounts(_message.Message):
    __slots__ = ("events", "facts", "conflicts", "traces", "trace_decisions", "facts_unlinked")
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    FACTS_FIELD_NUMBER: _ClassVar[int]
    CONFLICTS_FIELD_NUMBER: _ClassVar[int]
    TRACES_FIELD_NUMBER: _ClassVar[int]
    TRACE_DECISIONS_FIELD_NUMBER: _ClassVar[int]
    FACTS_UNLINKED_FIELD_NUMBER: _ClassVar[int]
    events: int
    facts: int
    conflicts: int
    traces: int
    trace_decisions: int
    facts_unlinked: int
    def __init__(self, events: _Optional[int] = ..., facts: _Optional[int] = ..., conflicts: _Optional[int] = ..., traces: _Optional[int] = ..., trace_decisions: _Optional[int] = ..., facts_unlinked: _Optional[int] = ...) -> None: ...

class DeleteEventRequest(_message.Message):
    __slots__ = ("project_id", "event_id")
    PROJECT_ID_FIELD_NUMBER: _ClassVar[int]
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    project_id: str
    event_id: str
    def __init__(self, project_id: _Optional[str] = ..., event_id: _Optional[str] = ...) -> None: ...

class DeleteEventResponse(_message.Message):
    __slots__ = ("deleted", "consistency_token")
    DELETED_FIELD_NUMBER: _ClassVar[int]
    CONSISTENCY_TOKEN_FIELD_NUMBER: _ClassVar[int]
    deleted: DeletedCounts
    consistency_token: str
    def __init__(self, deleted: _Optional[_Union[DeletedCounts, _Mapping]] = ..., consistency_token: _Optional[str] = ...) -> None: ...

class DeleteSubjectRequest(_message.Message):
    __slots__ = ("project_id", "subject_id")
    PROJECT_ID_FIELD_NUMBER: _ClassVar[int]
    SUBJECT_ID_FIELD_NUMBER: _ClassVar[int]
    project_id: str
    subject_id: str
    def __init__(self, project_id: _Optional[str] = ..., subject_id: _Optional[str] = ...) -> None: ...

class DeleteSubjectResponse(_message.Message):
    __slots__ = ("deleted", "consistency_token")
    DELETED_FIELD_NUMBER: _ClassVar[int]
    CONSISTENCY_TOKEN_FIELD_NUMBER: _ClassVar[int]
    deleted: DeletedCounts
    consistency_token: str
    def __init__(self, deleted: _Optional[_Union[DeletedCounts, _Mapping]] = ..., consistency_token: _Optional[str] = ...) -> None: ...

class DeleteProjectRequest(_message.Message):
    __slots__ = ("project_id",)
    PROJECT_ID_FIELD_NUMBER: _ClassVar[int]
    project_id: str
    def __init__(self, project_id: _Optional[str] = ...) -> None: ...

class DeleteProjectResponse(_message.Message):
    __slots__ = ("deleted", "consistency_token")
    DELETED_FIELD_NUMBER: _ClassVar[int]
    CONSISTENCY_TOKEN_FIELD_NUMBER: _ClassVar[int]
    deleted: DeletedCounts
    consistency_token: str
    def __init__(self, deleted: _Optional[_Union[DeletedCounts, _Mapping]] = ..., consistency_token: _Optional[str] = ...) -> None: ...
