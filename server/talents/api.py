"""TalentService: the gRPC face of the talent catalogue and selection.

Validates requests (every violation at once), maps messages, and calls
`satchel.server.talents.service.TalentService`, which holds the logic.
"""

from __future__ import annotations

import json
import math
from typing import Any

import grpc
from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp

from satchel.server.platform.api.pagination import (
    IdPageToken,
    decode_id_page_token,
    encode_id_page_token,
    query_fingerprint,
)
from satchel.server.platform.api.validation import (
    MAX_BUDGET_TOKENS,
    MAX_ID_CHARS,
    MAX_QUERY_CHARS,
    MAX_TEXT_CHARS,
    check_id,
    check_page_size,
    check_text,
)
from satchel.server.platform.errors import NotFound, Violations
from satchel.server.platform.runtime import RuntimeRef
from satchel.server.platform.tokens import estimate_tokens
from satchel.server.talents.domain.fusion import GateReport
from satchel.server.talents.domain.graph import InvalidEdgesError, validate_edges
from satchel.server.talents.domain.selection import Reason
from satchel.server.talents.service import Resolution, ResolvedTalent, TalentService
from satchel.server.talents.storage.catalogue import EDGE_KINDS, TalentRecord
from satchel.v1 import talent_pb2, talent_pb2_grpc

MAX_BODY_CHARS = 200_000
MAX_SCHEMA_CHARS = 64_000
EMPTY_SCHEMA = '{"type": "object"}'
MAX_LIST_ITEMS = 100
MAX_PARAM = 10.0
MAX_SERVED = 1000


def _check_list(violations: Violations, field: str, values: list[str], *, ids: bool) -> None:
    if len(values) > MAX_LIST_ITEMS:
        violations.add(field, f"must have at most {MAX_LIST_ITEMS} items")
        return
    for index, value in enumerate(values):
        if ids:
            check_id(violations, f"{field}[{index}]", value)
        else:
            check_text(
                violations, f"{field}[{index}]", value, max_chars=MAX_ID_CHARS, required=True
            )


def talent_record(request: talent_pb2.UpsertTalentRequest) -> TalentRecord:
    """The talent of an UpsertTalent request, validated; edge lists lose their duplicates."""
    violations = Violations()
    if not request.HasField("talent"):
        violations.add("talent", "is required")
        violations.raise_if_any()
    talent = request.talent
    check_id(violations, "talent.id", talent.id)
    check_text(violations, "talent.name", talent.name, max_chars=MAX_ID_CHARS, required=True)
    check_text(violations, "talent.summary", talent.summary, max_chars=MAX_TEXT_CHARS)
    check_text(violations, "talent.body", talent.body, max_chars=MAX_BODY_CHARS)
    _check_schema(violations, "talent.input_schema", talent.input_schema)
    for field in ("tags", "triggers", "task_types"):
        _check_list(violations, f"talent.{field}", list(getattr(talent, field)), ids=False)
    for field in ("roles", *EDGE_KINDS):
        _check_list(violations, f"talent.{field}", list(getattr(talent, field)), ids=True)
    try:
        validate_edges(talent.id, talent.requires, talent.includes, talent.recommends)
    except InvalidEdgesError as exc:
        for violation in exc.violations:
            violations.add(f"talent.{violation.field}", violation.description)
    violations.raise_if_any()
    return TalentRecord(
        id=talent.id,
        name=talent.name.strip(),
        summary=talent.summary,
        body=talent.body,
        tags=tuple(talent.tags),
        triggers=tuple(talent.triggers),
        task_types=tuple(talent.task_types),
        roles=tuple(dict.fromkeys(talent.roles)),
        requires=tuple(dict.fromkeys(talent.requires)),
        includes=tuple(dict.fromkeys(talent.includes)),
        recommends=tuple(dict.fromkeys(talent.recommends)),
        pinned=talent.pinned,
        input_schema=talent.input_schema.strip(),
    )


def _check_schema(violations: Violations, field: str, text: str) -> None:
    """Empty, or the JSON text of an object of at most MAX_SCHEMA_CHARS characters."""
    if not text.strip():
        return
    if len(text) > MAX_SCHEMA_CHARS:
        violations.add(field, f"must be at most {MAX_SCHEMA_CHARS} characters")
        return
    try:
        schema = json.loads(text)
    except ValueError as exc:
        violations.add(field, f"must be JSON text: {exc}")
        return
    if not isinstance(schema, dict):
        violations.add(field, "must be a JSON object (a JSON Schema)")


def talent_message(record: TalentRecord) -> talent_pb2.Talent:
    """A stored talent as a message."""
    message = talent_pb2.Talent(
        id=record.id,
        name=record.name,
        summary=record.summary,
        body=record.body,
        tags=record.tags,
        triggers=record.triggers,
        task_types=record.task_types,
        roles=record.roles,
        requires=record.requires,
        includes=record.includes,
        recommends=record.recommends,
        pinned=record.pinned,
        input_schema=record.input_schema,
    )
    if record.updated_at is not None:
        stamp = Timestamp()
        stamp.FromDatetime(record.updated_at)
        message.updated_at.CopyFrom(stamp)
    return message


def _check_param(violations: Violations, field: str, value: float, low: float, high: float) -> None:
    if not math.isfinite(value) or not low <= value <= high:
        violations.add(field, f"must be a number in [{low:g}, {high:g}]")


def _selected(talent: ResolvedTalent) -> talent_pb2.SelectedTalent:
    return talent_pb2.SelectedTalent(
        talent_id=talent.id,
        name=talent.name,
        score=talent.score,
        similarity=talent.similarity,
        stem_hits=talent.stem_hits,
        reason=talent.reason,
        tokens=talent.tokens,
        required_by=talent.required_by,
        text_rank=talent.text_rank,
    )


def _excluded(talent: ResolvedTalent) -> talent_pb2.ExcludedTalent:
    return talent_pb2.ExcludedTalent(
        talent_id=talent.id,
        reason=talent.reason,
        score=talent.score,
        name=talent.name,
        similarity=talent.similarity,
        stem_hits=talent.stem_hits,
        tokens=talent.tokens,
        required_by=talent.required_by,
        text_rank=talent.text_rank,
    )


def _given(request: Message, name: str) -> Any:
    """The value of an optional field, or None when the request leaves it unset."""
    return getattr(request, name) if request.HasField(name) else None


def _check_limits(
    violations: Violations,
    request: talent_pb2.ResolveTalentsRequest | talent_pb2.SearchToolsRequest,
) -> None:
    if request.HasField("budget_tokens") and not 1 <= request.budget_tokens <= MAX_BUDGET_TOKENS:
        violations.add("budget_tokens", f"must be in [1, {MAX_BUDGET_TOKENS}]")
    if request.HasField("max_served") and not 0 <= request.max_served <= MAX_SERVED:
        violations.add("max_served", f"must be in [0, {MAX_SERVED}]")


def tools_message(resolution: Resolution) -> talent_pb2.SearchToolsResponse:
    """A resolution as the tools an agent loads: name, description, input schema."""
    tools = []
    tokens = 0
    for decision, talent in zip(resolution.selected, resolution.served, strict=True):
        description = (talent.fields.summary if talent.fields else "") or talent.body
        schema = talent.input_schema or EMPTY_SCHEMA
        tokens += estimate_tokens(f"{talent.name}{description}{schema}")
        tools.append(
            talent_pb2.ToolMatch(
                talent_id=talent.id,
                name=talent.name,
                description=description,
                input_schema=schema,
                reason=decision.reason,
                required_by=decision.required_by,
                score=decision.score,
            )
        )
    chosen = {str(Reason.RELEVANCE), str(Reason.FALLBACK_TOP3)}
    none_fits = not any(decision.reason in chosen for decision in resolution.selected)
    note = ""
    if resolution.out_of_domain and resolution.gate is not None:
        note = f"no tool fits this task ({resolution.gate.note()})"
    elif none_fits:
        note = f"no tool fits this task ({resolution.note or 'none selected'})"
    return talent_pb2.SearchToolsResponse(
        tools=tools,
        none_fits=none_fits,
        note=note,
        tokens=tokens,
        selection=selection_message(resolution),
    )


def _gate(report: GateReport | None) -> talent_pb2.TalentGate | None:
    if report is None:
        return None
    return talent_pb2.TalentGate(
        best_similarity=report.best_similarity,
        similarity_threshold=report.gate.similarity,
        calibration_tasks=report.gate.calibration_tasks,
        unrelated_similarity=report.unrelated_similarity,
        best_word_match=report.best_word_match,
        best_word_score=report.best_word_score,
        word_score_threshold=report.word_score_level,
    )


def selection_message(resolution: Resolution) -> talent_pb2.TalentSelection:
    """A resolution as the wire's TalentSelection."""
    params = resolution.params
    return talent_pb2.TalentSelection(
        selected=[_selected(t) for t in resolution.selected],
        excluded=[_excluded(t) for t in resolution.excluded],
        out_of_domain=resolution.out_of_domain,
        note=resolution.note,
        compiled=resolution.compiled,
        tokens_selected=resolution.tokens_selected,
        tokens_candidates=resolution.tokens_candidates,
        relevance=(
            talent_pb2.RELEVANCE_MODE_EMBEDDINGS
            if resolution.relevance
            else talent_pb2.RELEVANCE_MODE_OFF
        ),
        gate=_gate(resolution.gate),
        excluded_unlisted=resolution.excluded_unlisted,
        params=talent_pb2.TalentSelectionParams(
            floor=params.floor or 0.0,
            beta=params.beta,
            margin=params.margin,
            budget_tokens=params.budget_tokens,
            scoring=str(params.scoring),
            text_weight=params.text_weight,
            max_served=params.max_served,
        ),
    )


class TalentServicer(talent_pb2_grpc.TalentServiceServicer):
    """Thin adapter over `satchel.server.talents.service.TalentService`."""

    def __init__(self, runtime: RuntimeRef) -> None:
        self._runtime = runtime
        self._service_instance: TalentService | None = None

    def _service(self) -> TalentService:
        runtime = self._runtime()
        if self._service_instance is None or self._service_instance.runtime is not runtime:
            self._service_instance = TalentService(runtime)
        return self._service_instance

    async def UpsertTalent(
        self,
        request: talent_pb2.UpsertTalentRequest,
        context: grpc.aio.ServicerContext[
            talent_pb2.UpsertTalentRequest, talent_pb2.UpsertTalentResponse
        ],
    ) -> talent_pb2.UpsertTalentResponse:
        """Create or replace a talent (self-edges refused, unknown targets kept)."""
        record = talent_record(request)
        stored, created = await self._service().upsert(record)
        return talent_pb2.UpsertTalentResponse(
            talent=talent_message(stored),
            created=created,
            consistency_token=await self._runtime().reads.consistency_token(),
        )

    async def ListTalents(
        self,
        request: talent_pb2.ListTalentsRequest,
        context: grpc.aio.ServicerContext[
            talent_pb2.ListTalentsRequest, talent_pb2.ListTalentsResponse
        ],
    ) -> talent_pb2.ListTalentsResponse:
        """The catalogue, or a project's talents with their activation, by id, page by page."""
        violations = Violations()
        check_id(violations, "project_id", request.project_id, required=request.active_only)
        limit = check_page_size(violations, "page_size", request.page_size)
        fingerprint = query_fingerprint("talents", request.project_id, request.active_only)
        secret = self._runtime().page_secret
        token = decode_id_page_token(
            violations, "page_token", request.page_token, fingerprint, secret
        )
        violations.raise_if_any()
        talents, active = await self._service().list_talents(
            request.project_id,
            request.active_only,
            after_id=token.last_id if token else None,
            limit=limit + 1,
        )
        next_token = ""
        if len(talents) > limit:
            talents = talents[:limit]
            listed = {t.id for t in talents}
            active = [talent_id for talent_id in active if talent_id in listed]
            last = IdPageToken(last_id=talents[-1].id)
            next_token = encode_id_page_token(secret, fingerprint, last)
        return talent_pb2.ListTalentsResponse(
            talents=[talent_message(t) for t in talents],
            active_talent_ids=active,
            next_page_token=next_token,
        )

    async def SetTalentActivation(
        self,
        request: talent_pb2.SetTalentActivationRequest,
        context: grpc.aio.ServicerContext[
            talent_pb2.SetTalentActivationRequest, talent_pb2.SetTalentActivationResponse
        ],
    ) -> talent_pb2.SetTalentActivationResponse:
        """Turn a talent on or off for a project (NOT_FOUND for an unknown talent)."""
        violations = Violations()
        check_id(violations, "project_id", request.project_id)
        check_id(violations, "talent_id", request.talent_id)
        violations.raise_if_any()
        found = await self._service().set_activation(
            request.project_id, request.talent_id, request.active
        )
        if not found:
            raise NotFound(
                f"talent {request.talent_id!r} is not in the catalogue",
                reason="TALENT_NOT_FOUND",
                metadata={"talent_id": request.talent_id},
            )
        return talent_pb2.SetTalentActivationResponse(
            project_id=request.project_id,
            talent_id=request.talent_id,
            active=request.active,
            consistency_token=await self._runtime().reads.consistency_token(),
        )

    async def ResolveTalents(
        self,
        request: talent_pb2.ResolveTalentsRequest,
        context: grpc.aio.ServicerContext[
            talent_pb2.ResolveTalentsRequest, talent_pb2.ResolveTalentsResponse
        ],
    ) -> talent_pb2.ResolveTalentsResponse:
        """Select the talents an agent of a role receives for a task."""
        service = self._service()
        violations = Violations()
        check_id(violations, "project_id", request.project_id)
        check_id(violations, "role", request.role, required=False)
        mode = request.relevance
        if mode not in talent_pb2.RelevanceMode.values():
            violations.add("relevance", f"unknown relevance mode {mode}")
        relevance = (
            service.default_relevance()
            if mode == talent_pb2.RELEVANCE_MODE_UNSPECIFIED
            else mode == talent_pb2.RELEVANCE_MODE_EMBEDDINGS
        )
        check_text(violations, "task", request.task, max_chars=MAX_QUERY_CHARS, required=relevance)
        _check_limits(violations, request)
        if request.HasField("floor"):
            _check_param(violations, "floor", request.floor, -1.0, 1.0)
        if request.HasField("beta"):
            _check_param(violations, "beta", request.beta, 0.0, MAX_PARAM)
        if request.HasField("margin"):
            _check_param(violations, "margin", request.margin, 0.0, MAX_PARAM)
        violations.raise_if_any()
        params = service.params(
            floor=_given(request, "floor"),
            beta=_given(request, "beta"),
            margin=_given(request, "margin"),
            budget_tokens=_given(request, "budget_tokens"),
            max_served=_given(request, "max_served"),
        )
        resolution = await service.resolve(
            request.project_id, request.role, request.task, relevance=relevance, params=params
        )
        return talent_pb2.ResolveTalentsResponse(selection=selection_message(resolution))

    async def SearchTools(
        self,
        request: talent_pb2.SearchToolsRequest,
        context: grpc.aio.ServicerContext[
            talent_pb2.SearchToolsRequest, talent_pb2.SearchToolsResponse
        ],
    ) -> talent_pb2.SearchToolsResponse:
        """The selection by relevance as tools to load, or an explicit none fits."""
        service = self._service()
        violations = Violations()
        check_id(violations, "project_id", request.project_id)
        check_id(violations, "role", request.role, required=False)
        check_text(violations, "task", request.task, max_chars=MAX_QUERY_CHARS, required=True)
        _check_limits(violations, request)
        violations.raise_if_any()
        params = service.params(
            budget_tokens=_given(request, "budget_tokens"),
            max_served=_given(request, "max_served"),
        )
        resolution = await service.resolve(
            request.project_id, request.role, request.task, relevance=True, params=params
        )
        return tools_message(resolution)

    async def DiagnoseProject(
        self,
        request: talent_pb2.DiagnoseProjectRequest,
        context: grpc.aio.ServicerContext[
            talent_pb2.DiagnoseProjectRequest, talent_pb2.DiagnoseProjectResponse
        ],
    ) -> talent_pb2.DiagnoseProjectResponse:
        """The doctor: what is wrong with a project's active talents."""
        violations = Violations()
        check_id(violations, "project_id", request.project_id)
        _check_list(violations, "roles", list(request.roles), ids=True)
        violations.raise_if_any()
        findings, roles_known = await self._service().diagnose(
            request.project_id, list(request.roles)
        )
        return talent_pb2.DiagnoseProjectResponse(
            findings=[
                talent_pb2.DiagnosisFinding(
                    code=str(f.code), talent_id=f.talent_id, detail=f.detail
                )
                for f in findings
            ],
            roles_known=roles_known,
        )
