"""Request builders shared by both clients: Python values in, `satchel.v1` request messages out.

Datetimes become `Timestamp`s (naive ones are taken as UTC), timedeltas `Duration`s, JSON-like
values `Value`/`Struct`. Use `event_request` and `fact_request` to build the items of
`batch_record_events` and `batch_assert_facts`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from google.protobuf import duration_pb2, json_format, struct_pb2, timestamp_pb2

from satchel.v1 import context_pb2, memory_pb2, talent_pb2

RELEVANCE_MODES: dict[str, talent_pb2.RelevanceMode] = {
    "default": talent_pb2.RELEVANCE_MODE_UNSPECIFIED,
    "off": talent_pb2.RELEVANCE_MODE_OFF,
    "embeddings": talent_pb2.RELEVANCE_MODE_EMBEDDINGS,
}


def timestamp(moment: datetime | None) -> timestamp_pb2.Timestamp | None:
    """A `Timestamp` of a datetime (naive means UTC), None for None."""
    if moment is None:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    stamp = timestamp_pb2.Timestamp()
    stamp.FromDatetime(moment)
    return stamp


def duration(span: timedelta | None) -> duration_pb2.Duration | None:
    """A `Duration` of a timedelta, None for None."""
    if span is None:
        return None
    message = duration_pb2.Duration()
    message.FromTimedelta(span)
    return message


def value(data: Any) -> struct_pb2.Value:
    """A JSON-like Python value (str, number, bool, None, list, dict) as a `Value`."""
    if isinstance(data, struct_pb2.Value):
        return data
    return json_format.ParseDict(data, struct_pb2.Value())


def struct(data: Mapping[str, Any] | struct_pb2.Struct | None) -> struct_pb2.Struct | None:
    """A JSON object as a `Struct`, None for None."""
    if data is None or isinstance(data, struct_pb2.Struct):
        return data
    return json_format.ParseDict(dict(data), struct_pb2.Struct())


def relevance_mode(mode: str | int) -> talent_pb2.RelevanceMode:
    """`"default" | "off" | "embeddings"` (or the enum value) as a `RelevanceMode`."""
    if isinstance(mode, str):
        try:
            return RELEVANCE_MODES[mode]
        except KeyError:
            raise ValueError(f"relevance must be one of {sorted(RELEVANCE_MODES)}") from None
    for known in RELEVANCE_MODES.values():
        if known == mode:
            return known
    raise ValueError(f"relevance must be one of {sorted(RELEVANCE_MODES.values())}, not {mode}")


# --- ContextService -------------------------------------------------------------------------


def assemble_context(
    project_id: str,
    subject_id: str,
    query: str,
    *,
    budget_tokens: int | None = None,
    as_of: datetime | None = None,
    max_distance: float | None = None,
    min_consistency_token: str = "",
) -> context_pb2.AssembleContextRequest:
    """An AssembleContextRequest (the server's default budget and relevance floor when
    `budget_tokens` and `max_distance` are None; `max_distance=0` turns the floor off)."""
    return context_pb2.AssembleContextRequest(
        project_id=project_id,
        subject_id=subject_id,
        query=query,
        budget_tokens=budget_tokens,
        as_of=timestamp(as_of),
        max_distance=max_distance,
        min_consistency_token=min_consistency_token,
    )


def stream_context(
    project_id: str,
    subject_id: str,
    query: str,
    *,
    budget_tokens: int | None = None,
    as_of: datetime | None = None,
    max_distance: float | None = None,
    max_decisions_per_message: int = 0,
    min_consistency_token: str = "",
) -> context_pb2.StreamContextRequest:
    """A StreamContextRequest (AssembleContext's fields; `max_decisions_per_message` above 1
    has the decisions sent in batches, in `decisions`)."""
    return context_pb2.StreamContextRequest(
        project_id=project_id,
        subject_id=subject_id,
        query=query,
        budget_tokens=budget_tokens,
        as_of=timestamp(as_of),
        max_distance=max_distance,
        max_decisions_per_message=max_decisions_per_message,
        min_consistency_token=min_consistency_token,
    )


# --- MemoryService --------------------------------------------------------------------------


def event_request(
    project_id: str,
    subject_id: str,
    kind: str,
    payload: Mapping[str, Any] | None = None,
    *,
    occurred_at: datetime | None = None,
    idempotency_key: str = "",
) -> memory_pb2.RecordEventRequest:
    """A RecordEventRequest (also an item of `batch_record_events`)."""
    return memory_pb2.RecordEventRequest(
        project_id=project_id,
        subject_id=subject_id,
        kind=kind,
        payload=struct(payload),
        occurred_at=timestamp(occurred_at),
        idempotency_key=idempotency_key,
    )


def fact_request(
    project_id: str,
    subject_id: str,
    predicate: str,
    value_: Any,
    *,
    statement: str = "",
    confidence: float | None = None,
    valid_from: datetime | None = None,
    valid_to: datetime | None = None,
    source_event_ids: Iterable[str] = (),
    stale_after: timedelta | None = None,
    idempotency_key: str = "",
    supersedes_fact_ids: Iterable[str] = (),
) -> memory_pb2.AssertFactRequest:
    """An AssertFactRequest (also an item of `batch_assert_facts`); `value_` is JSON-like."""
    return memory_pb2.AssertFactRequest(
        project_id=project_id,
        subject_id=subject_id,
        predicate=predicate,
        value=value(value_),
        statement=statement,
        confidence=confidence,
        valid_from=timestamp(valid_from),
        valid_to=timestamp(valid_to),
        source_event_ids=list(source_event_ids),
        stale_after=duration(stale_after),
        idempotency_key=idempotency_key,
        supersedes_fact_ids=list(supersedes_fact_ids),
    )


def list_facts(
    project_id: str,
    subject_id: str,
    *,
    as_of: datetime | None = None,
    include_inactive: bool = False,
    page_size: int = 0,
    page_token: str = "",
    min_consistency_token: str = "",
) -> memory_pb2.ListFactsRequest:
    """A ListFactsRequest (`page_size` 0: the server's default)."""
    return memory_pb2.ListFactsRequest(
        project_id=project_id,
        subject_id=subject_id,
        as_of=timestamp(as_of),
        include_inactive=include_inactive,
        page_size=page_size,
        page_token=page_token,
        min_consistency_token=min_consistency_token,
    )


def list_events(
    project_id: str,
    subject_id: str,
    *,
    as_of: datetime | None = None,
    page_size: int = 0,
    page_token: str = "",
    min_consistency_token: str = "",
) -> memory_pb2.ListEventsRequest:
    """A ListEventsRequest (`page_size` 0: the server's default)."""
    return memory_pb2.ListEventsRequest(
        project_id=project_id,
        subject_id=subject_id,
        as_of=timestamp(as_of),
        page_size=page_size,
        page_token=page_token,
        min_consistency_token=min_consistency_token,
    )


def list_conflicts(
    project_id: str,
    subject_id: str,
    *,
    include_resolved: bool = False,
    page_size: int = 0,
    page_token: str = "",
    min_consistency_token: str = "",
) -> memory_pb2.ListConflictsRequest:
    """A ListConflictsRequest (`page_size` 0: the server's default)."""
    return memory_pb2.ListConflictsRequest(
        project_id=project_id,
        subject_id=subject_id,
        include_resolved=include_resolved,
        page_size=page_size,
        page_token=page_token,
        min_consistency_token=min_consistency_token,
    )


# --- TalentService --------------------------------------------------------------------------


def resolve_talents(
    project_id: str,
    task: str,
    *,
    role: str = "",
    relevance: str | int = "default",
    budget_tokens: int | None = None,
    floor: float | None = None,
    beta: float | None = None,
    margin: float | None = None,
    max_served: int | None = None,
) -> talent_pb2.ResolveTalentsRequest:
    """A ResolveTalentsRequest; unset overrides keep the server's parameters."""
    return talent_pb2.ResolveTalentsRequest(
        project_id=project_id,
        role=role,
        task=task,
        relevance=relevance_mode(relevance),
        budget_tokens=budget_tokens,
        floor=floor,
        beta=beta,
        margin=margin,
        max_served=max_served,
    )


def search_tools(
    project_id: str,
    task: str,
    *,
    role: str = "",
    budget_tokens: int | None = None,
    max_served: int | None = None,
) -> talent_pb2.SearchToolsRequest:
    """A SearchToolsRequest; unset limits keep the server's."""
    return talent_pb2.SearchToolsRequest(
        project_id=project_id,
        role=role,
        task=task,
        budget_tokens=budget_tokens,
        max_served=max_served,
    )


def list_talents(
    project_id: str = "", *, active_only: bool = False, page_size: int = 0, page_token: str = ""
) -> talent_pb2.ListTalentsRequest:
    """A ListTalentsRequest (`page_size` 0: the server's default)."""
    return talent_pb2.ListTalentsRequest(
        project_id=project_id, active_only=active_only, page_size=page_size, page_token=page_token
    )
