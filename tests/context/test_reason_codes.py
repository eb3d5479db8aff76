"""Decision.reason (the ReasonCode enum) beside Decision.reason_code (the string it replaces for
new code): every code the packer can emit has its enum value, and real calls send both, equal."""

from __future__ import annotations

import grpc
from helpers.memory import fact_request
from helpers.memory import stub as memory_stub

from satchel.server.context.api import REASONS, reason_enum
from satchel.server.context.domain import packing
from satchel.v1 import context_pb2 as pb
from satchel.v1 import context_pb2_grpc, memory_pb2

SUBJECT = "user-1"


def test_every_reason_code_of_the_packer_has_its_enum_value() -> None:
    for code in packing.REASON_CODES:
        value = reason_enum(code)
        assert value != pb.REASON_CODE_UNSPECIFIED, code
        assert pb.ReasonCode.Name(value) == f"REASON_CODE_{code.upper()}"
    assert set(REASONS) == set(packing.REASON_CODES)
    emitted = sorted(REASONS.values())
    assert emitted == sorted(v for v in pb.ReasonCode.values() if v != pb.REASON_CODE_UNSPECIFIED)


def test_a_reason_without_an_enum_value_is_unspecified() -> None:
    assert reason_enum("a_reason_of_a_newer_server") == pb.REASON_CODE_UNSPECIFIED


def _consistent(decisions: list[pb.Decision]) -> set[str]:
    """Assert every decision's enum matches its string; return the strings seen."""
    for d in decisions:
        assert d.reason == REASONS[d.reason_code], (d.reason_code, d.reason)
    return {d.reason_code for d in decisions}


async def test_context_calls_send_the_enum_and_the_string_consistently(
    channel: grpc.aio.Channel, project_id: str
) -> None:
    memory = memory_stub(channel)
    statements = [
        "Caroline lives in Lisbon",
        "Caroline lives in Porto",
        "Caroline has a dog named Biscuit who loves long walks on the beach every morning",
        "Caroline works as a nurse on night shifts at the hospital near the river",
    ]
    ids = []
    for i, statement in enumerate(statements):
        request = fact_request(project_id, predicate=f"p{i}", value=i, statement=statement)
        ids.append((await memory.AssertFact(request)).fact.id)
    await memory.OpenConflict(
        memory_pb2.OpenConflictRequest(project_id=project_id, subject_id=SUBJECT, fact_ids=ids[:2])
    )
    context = context_pb2_grpc.ContextServiceStub(channel)
    fields = {"project_id": project_id, "subject_id": SUBJECT, "query": "Where does Caroline live?"}
    reply = await context.AssembleContext(
        pb.AssembleContextRequest(**fields, budget_tokens=40, max_distance=0)
    )
    trace = (
        await context.GetTrace(pb.GetTraceRequest(project_id=project_id, trace_id=reply.trace_id))
    ).trace
    seen = _consistent(list(trace.decisions))
    assert {"relevance", "over_budget", "conflict_open"} <= seen

    streamed = [
        message.decision
        async for message in context.StreamContext(
            pb.StreamContextRequest(**fields, budget_tokens=40, max_distance=0)
        )
        if message.WhichOneof("event") == "decision"
    ]
    assert _consistent(streamed) == seen

    floor = await context.AssembleContext(pb.AssembleContextRequest(**fields, max_distance=0.01))
    trace = (
        await context.GetTrace(pb.GetTraceRequest(project_id=project_id, trace_id=floor.trace_id))
    ).trace
    assert "below_relevance_floor" in _consistent(list(trace.decisions))
