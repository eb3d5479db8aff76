import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RelevanceMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RELEVANCE_MODE_UNSPECIFIED: _ClassVar[RelevanceMode]
    RELEVANCE_MODE_OFF: _ClassVar[RelevanceMode]
    RELEVANCE_MODE_EMBEDDINGS: _ClassVar[RelevanceMode]
RELEVANCE_MODE_UNSPECIFIED: RelevanceMode
RELEVANCE_MODE_OFF: RelevanceMode
RELEVANCE_MODE_EMBEDDINGS: RelevanceMode

class Talent(_message.Message):
    __slots__ = ("id", "name", "summary", "body", "tags", "triggers", "task_types", "roles", "requires", "includes", "recommends", "updated_at", "pinned", "input_schema")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    TRIGGERS_FIELD_NUMBER: _ClassVar[int]
    TASK_TYPES_FIELD_NUMBER: _ClassVar[int]
    ROLES_FIELD_NUMBER: _ClassVar[int]
    REQUIRES_FIELD_NUMBER: _ClassVar[int]
    INCLUDES_FIELD_NUMBER: _ClassVar[int]
    RECOMMENDS_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    PINNED_FIELD_NUMBER: _ClassVar[int]
    INPUT_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    id: str
    name: str
    summary: str
    body: str
    tags: _containers.RepeatedScalarFieldContainer[str]
    triggers: _containers.RepeatedScalarFieldContainer[str]
    task_types: _containers.RepeatedScalarFieldContainer[str]
    roles: _containers.RepeatedScalarFieldContainer[str]
    requires: _containers.RepeatedScalarFieldContainer[str]
    includes: _containers.RepeatedScalarFieldContainer[str]
    recommends: _containers.RepeatedScalarFieldContainer[str]
    updated_at: _timestamp_pb2.Timestamp
    pinned: bool
    input_schema: str
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., summary: _Optional[str] = ..., body: _Optional[str] = ..., tags: _Optional[_Iterable[str]] = ..., triggers: _Optional[_Iterable[str]] = ..., task_types: _Optional[_Iterable[str]] = ..., roles: _Optional[_Iterable[str]] = ..., requires: _Optional[_Iterable[str]] = ..., includes: _Optional[_Iterable[str]] = ..., recommends: _Optional[_Iterable[str]] = ..., updated_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., pinned: _Optional[bool] = ..., input_schema: _Optional[str] = ...) -> None: ...

class SelectedTalent(_message.Message):
    __slots__ = ("talent_id", "name", "score", "similarity", "stem_hits", "reason", "tokens", "required_by", "text_rank")
    TALENT_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    SIMILARITY_FIELD_NUMBER: _ClassVar[int]
    STEM_HITS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    REQUIRED_BY_FIELD_NUMBER: _ClassVar[int]
    TEXT_RANK_FIELD_NUMBER: _ClassVar[int]
    talent_id: str
    name: str
    score: float
    similarity: float
    stem_hits: int
    reason: str
    tokens: int
    required_by: str
    text_rank: float
    def __init__(self, talent_id: _Optional[str] = ..., name: _Optional[str] = ..., score: _Optional[float] = ..., similarity: _Optional[float] = ..., stem_hits: _Optional[int] = ..., reason: _Optional[str] = ..., tokens: _Optional[int] = ..., required_by: _Optional[str] = ..., text_rank: _Optional[float] = ...) -> None: ...

class ExcludedTalent(_message.Message):
    __slots__ = ("talent_id", "reason", "score", "name", "similarity", "stem_hits", "tokens", "required_by", "text_rank")
    TALENT_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    SIMILARITY_FIELD_NUMBER: _ClassVar[int]
    STEM_HITS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    REQUIRED_BY_FIELD_NUMBER: _ClassVar[int]
    TEXT_RANK_FIELD_NUMBER: _ClassVar[int]
    talent_id: str
    reason: str
    score: float
    name: str
    similarity: float
    stem_hits: int
    tokens: int
    required_by: str
    text_rank: float
    def __init__(self, talent_id: _Optional[str] = ..., reason: _Optional[str] = ..., score: _Optional[float] = ..., name: _Optional[str] = ..., similarity: _Optional[float] = ..., stem_hits: _Optional[int] = ..., tokens: _Optional[int] = ..., required_by: _Optional[str] = ..., text_rank: _Optional[float] = ...) -> None: ...

class TalentSelection(_message.Message):
    __slots__ = ("selected", "excluded", "out_of_domain", "note", "compiled", "tokens_selected", "tokens_candidates", "relevance", "params", "gate", "excluded_unlisted")
    SELECTED_FIELD_NUMBER: _ClassVar[int]
    EXCLUDED_FIELD_NUMBER: _ClassVar[int]
    OUT_OF_DOMAIN_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    COMPILED_FIELD_NUMBER: _ClassVar[int]
    TOKENS_SELECTED_FIELD_NUMBER: _ClassVar[int]
    TOKENS_CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    RELEVANCE_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    GATE_FIELD_NUMBER: _ClassVar[int]
    EXCLUDED_UNLISTED_FIELD_NUMBER: _ClassVar[int]
    selected: _containers.RepeatedCompositeFieldContainer[SelectedTalent]
    excluded: _containers.RepeatedCompositeFieldContainer[ExcludedTalent]
    out_of_domain: bool
    note: str
    compiled: str
    tokens_selected: int
    tokens_candidates: int
    relevance: RelevanceMode
    params: TalentSelectionParams
    gate: TalentGate
    excluded_unlisted: int
    def __init__(self, selected: _Optional[_Iterable[_Union[SelectedTalent, _Mapping]]] = ..., excluded: _Optional[_Iterable[_Union[ExcludedTalent, _Mapping]]] = ..., out_of_domain: _Optional[bool] = ..., note: _Optional[str] = ..., compiled: _Optional[str] = ..., tokens_selected: _Optional[int] = ..., tokens_candidates: _Optional[int] = ..., relevance: _Optional[_Union[RelevanceMode, str]] = ..., params: _Optional[_Union[TalentSelectionParams, _Mapping]] = ..., gate: _Optional[_Union[TalentGate, _Mapping]] = ..., excluded_unlisted: _Optional[int] = ...) -> None: ...

class TalentGate(_message.Message):
    __slots__ = ("best_similarity", "similarity_threshold", "calibration_tasks", "unrelated_similarity", "best_word_match", "best_word_score", "word_score_threshold")
    BEST_SIMILARITY_FIELD_NUMBER: _ClassVar[int]
    SIMILARITY_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    CALIBRATION_TASKS_FIELD_NUMBER: _ClassVar[int]
    UNRELATED_SIMILARITY_FIELD_NUMBER: _ClassVar[int]
    BEST_WORD_MATCH_FIELD_NUMBER: _ClassVar[int]
    BEST_WORD_SCORE_FIELD_NUMBER: _ClassVar[int]
    WORD_SCORE_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    best_similarity: float
    similarity_threshold: float
    calibration_tasks: int
    unrelated_similarity: float
    best_word_match: float
    best_word_score: float
    word_score_threshold: float
    def __init__(self, best_similarity: _Optional[float] = ..., similarity_threshold: _Optional[float] = ..., calibration_tasks: _Optional[int] = ..., unrelated_similarity: _Optional[float] = ..., best_word_match: _Optional[float] = ..., best_word_score: _Optional[float] = ..., word_score_threshold: _Optional[float] = ...) -> None: ...

class TalentSelectionParams(_message.Message):
    __slots__ = ("floor", "beta", "margin", "budget_tokens", "scoring", "text_weight", "max_served")
    FLOOR_FIELD_NUMBER: _ClassVar[int]
    BETA_FIELD_NUMBER: _ClassVar[int]
    MARGIN_FIELD_NUMBER: _ClassVar[int]
    BUDGET_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SCORING_FIELD_NUMBER: _ClassVar[int]
    TEXT_WEIGHT_FIELD_NUMBER: _ClassVar[int]
    MAX_SERVED_FIELD_NUMBER: _ClassVar[int]
    floor: float
    beta: float
    margin: float
    budget_tokens: int
    scoring: str
    text_weight: float
    max_served: int
    def __init__(self, floor: _Optional[float] = ..., beta: _Optional[float] = ..., margin: _Optional[float] = ..., budget_tokens: _Optional[int] = ..., scoring: _Optional[str] = ..., text_weight: _Optional[float] = ..., max_served: _Optional[int] = ...) -> None: ...

class DiagnosisFinding(_message.Message):
    __slots__ = ("code", "talent_id", "detail")
    CODE_FIELD_NUMBER: _ClassVar[int]
    TALENT_ID_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    code: str
    talent_id: str
    detail: str
    def __init__(self, code: _Optional[str] = ..., talent_id: _Optional[str] = ..., detail: _Optional[str] = ...) -> None: ...

class UpsertTalentRequest(_message.Message):
    __slots__ = ("talent",)
    TALENT_FIELD_NUMBER: _ClassVar[int]
    talent: Talent
    def __init__(self, talent: _Optional[_Union[Talent, _Mapping]] = ...) -> None: ...

class UpsertTalentResponse(_message.Message):
    __slots__ = ("talent", "created", "consistency_token")
    TALENT_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    CONSISTENCY_TOKEN_FIELD_NUMBER: _ClassVar[int]
    talent: Talent
    created: bool
    consistency_token: str
    def __init__(self, talent: _Optional[_Union[Talent, _Mapping]] = ..., created: _Optional[bool] = ..., consistency_token: _Optional[str] = ...) -> None: ...

class ListTalentsRequest(_message.Message):
    __slots__ = ("project_id", "active_only", "page_size", "page_token")
    PROJECT_ID_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_ONLY_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    project_id: str
    active_only: bool
    page_size: int
    page_token: str
    def __init__(self, project_id: _Optional[str] = ..., active_only: _Optional[bool] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListTalentsResponse(_message.Message):
    __slots__ = ("talents", "active_talent_ids", "next_page_token")
    TALENTS_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_TALENT_IDS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    talents: _containers.RepeatedCompositeFieldContainer[Talent]
    active_talent_ids: _containers.RepeatedScalarFieldContainer[str]
    next_page_token: str
    def __init__(self, talents: _Optional[_Iterable[_Union[Talent, _Mapping]]] = ..., active_talent_ids: _Optional[_Iterable[str]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class SetTalentActivationRequest(_message.Message):
    __slots__ = ("project_id", "talent_id", "active")
    PROJECT_ID_FIELD_NUMBER: _ClassVar[int]
    TALENT_ID_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_FIELD_NUMBER: _ClassVar[int]
    project_id: str
    talent_id: str
    active: bool
    def __init__(self, project_id: _Optional[str] = ..., talent_id: _Optional[str] = ..., active: _Optional[bool] = ...) -> None: ...

class SetTalentActivationResponse(_message.Message):
    __slots__ = ("project_id", "talent_id", "active", "consistency_token")
    PROJECT_ID_FIELD_NUMBER: _ClassVar[int]
    TALENT_ID_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_FIELD_NUMBER: _ClassVar[int]
    CONSISTENCY_TOKEN_FIELD_NUMBER: _ClassVar[int]
    project_id: str
    talent_id: str
    active: bool
    consistency_token: str
    def __init__(self, project_id: _Optional[str] = ..., talent_id: _Optional[str] = ..., active: _Optional[bool] = ..., consistency_token: _Optional[str] = ...) -> None: ...

class ResolveTalentsRequest(_message.Message):
    __slots__ = ("project_id", "role", "task", "relevance", "budget_tokens", "floor", "beta", "margin", "max_served")
    PROJECT_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    RELEVANCE_FIELD_NUMBER: _ClassVar[int]
    BUDGET_TOKENS_FIELD_NUMBER: _ClassVar[int]
    FLOOR_FIELD_NUMBER: _ClassVar[int]
    BETA_FIELD_NUMBER: _ClassVar[int]
    MARGIN_FIELD_NUMBER: _ClassVar[int]
    MAX_SERVED_FIELD_NUMBER: _ClassVar[int]
    project_id: str
    role: str
    task: str
    relevance: RelevanceMode
    budget_tokens: int
    floor: float
    beta: float
    margin: float
    max_served: int
    def __init__(self, project_id: _Optional[str] = ..., role: _Optional[str] = ..., task: _Optional[str] = ..., relevance: _Optional[_Union[RelevanceMode, str]] = ..., budget_tokens: _Optional[int] = ..., floor: _Optional[float] = ..., beta: _Optional[float] = ..., margin: _Optional[float] = ..., max_served: _Optional[int] = ...) -> None: ...

class ResolveTalentsResponse(_message.Message):
    __slots__ = ("selection",)
    SELECTION_FIELD_NUMBER: _ClassVar[int]
    selection: TalentSelection
    def __init__(self, selection: _Optional[_Union[TalentSelection, _Mapping]] = ...) -> None: ...

class DiagnoseProjectRequest(_message.Message):
    __slots__ = ("project_id", "roles")
    PROJECT_ID_FIELD_NUMBER: _ClassVar[int]
    ROLES_FIELD_NUMBER: _ClassVar[int]
    project_id: str
    roles: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, project_id: _Optional[str] = ..., roles: _Optional[_Iterable[str]] = ...) -> None: ...

class DiagnoseProjectResponse(_message.Message):
    __slots__ = ("findings", "roles_known")
    FINDINGS_FIELD_NUMBER: _ClassVar[int]
    ROLES_KNOWN_FIELD_NUMBER: _ClassVar[int]
    findings: _containers.RepeatedCompositeFieldContainer[DiagnosisFinding]
    roles_known: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, findings: _Optional[_Iterable[_Union[DiagnosisFinding, _Mapping]]] = ..., roles_known: _Optional[_Iterable[str]] = ...) -> None: ...

class SearchToolsRequest(_message.Message):
    __slots__ = ("project_id", "role", "task", "budget_tokens", "max_served")
    PROJECT_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    BUDGET_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_SERVED_FIELD_NUMBER: _ClassVar[int]
    project_id: str
    role: str
    task: str
    budget_tokens: int
    max_served: int
    def __init__(self, project_id: _Optional[str] = ..., role: _Optional[str] = ..., task: _Optional[str] = ..., budget_tokens: _Optional[int] = ..., max_served: _Optional[int] = ...) -> None: ...

class ToolMatch(_message.Message):
    __slots__ = ("talent_id", "name", "description", "input_schema", "reason", "required_by", "score")
    TALENT_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    INPUT_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    REQUIRED_BY_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    talent_id: str
    name: str
    description: str
    input_schema: str
    reason: str
    required_by: str
    score: float
    def __init__(self, talent_id: _Optional[str] = ..., name: _Optional[str] = ..., description: _Optional[str] = ..., input_schema: _Optional[str] = ..., reason: _Optional[str] = ..., required_by: _Optional[str] = ..., score: _Optional[float] = ...) -> None: ...

class SearchToolsResponse(_message.Message):
    __slots__ = ("tools", "none_fits", "note", "tokens", "selection")
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    NONE_FITS_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    SELECTION_FIELD_NUMBER: _ClassVar[int]
    tools: _containers.RepeatedCompositeFieldContainer[ToolMatch]
    none_fits: bool
    note: str
    tokens: int
    selection: TalentSelection
    def __init__(self, tools: _Optional[_Iterable[_Union[ToolMatch, _Mapping]]] = ..., none_fits: _Optional[bool] = ..., note: _Optional[str] = ..., tokens: _Optional[int] = ..., selection: _Optional[_Union[TalentSelection, _Mapping]] = ...) -> None: ...
