"""Helpers for the TalentService tests: stubs, upserts, activation, rich error details."""

from __future__ import annotations

from collections.abc import Iterable

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from satchel.v1 import talent_pb2, talent_pb2_grpc


def stub(channel: grpc.aio.Channel) -> talent_pb2_grpc.TalentServiceStub:
    return talent_pb2_grpc.TalentServiceStub(channel)


async def upsert(
    talents: talent_pb2_grpc.TalentServiceStub, talent_id: str, name: str = "", **fields: object
) -> talent_pb2.UpsertTalentResponse:
    """Upsert a talent; name defaults to the id, body to one sentence."""
    fields.setdefault("body", f"How to apply {name or talent_id}.")
    talent = talent_pb2.Talent(id=talent_id, name=name or talent_id, **fields)
    return await talents.UpsertTalent(talent_pb2.UpsertTalentRequest(talent=talent))


async def activate(
    talents: talent_pb2_grpc.TalentServiceStub,
    project_id: str,
    talent_ids: Iterable[str],
    active: bool = True,
) -> None:
    for talent_id in talent_ids:
        await talents.SetTalentActivation(
            talent_pb2.SetTalentActivationRequest(
                project_id=project_id, talent_id=talent_id, active=active
            )
        )


async def resolve(
    talents: talent_pb2_grpc.TalentServiceStub,
    project_id: str,
    task: str,
    *,
    role: str = "",
    relevance: int = talent_pb2.RELEVANCE_MODE_EMBEDDINGS,
    **overrides: float | int,
) -> talent_pb2.TalentSelection:
    request = talent_pb2.ResolveTalentsRequest(
        project_id=project_id, role=role, task=task, relevance=relevance, **overrides
    )
    return (await talents.ResolveTalents(request)).selection


def field_violations(error: grpc.aio.AioRpcError) -> dict[str, str]:
    """The BadRequest field violations of a rich error, by field."""
    status = rpc_status.from_call(error)
    assert status is not None, "the error carries no google.rpc.Status"
    found: dict[str, str] = {}
    for detail in status.details:
        if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            detail.Unpack(bad)
            found.update({v.field: v.description for v in bad.field_violations})
    return found


def error_reason(error: grpc.aio.AioRpcError) -> str:
    """The ErrorInfo reason of a rich error."""
    status = rpc_status.from_call(error)
    assert status is not None
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            return info.reason
    return ""


def reasons(selection: talent_pb2.TalentSelection) -> dict[str, str]:
    """Every decision of a selection: talent id -> reason."""
    return {
        **{t.talent_id: t.reason for t in selection.excluded},
        **{t.talent_id: t.reason for t in selection.selected},
    }
