"""ContextService: the gRPC face of context assembly (validate, run `assemble`, map)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import structlog

from satchel.server.context.domain import packing
from satchel.server.context.domain.trace_ids import issued_at, new_trace_id
from satchel.server.context.service import PREVIEW_CHARS, ContextRequest, Packet, PassEnd, assemble
from satchel.server.context.storage import traces as retention
from satchel.server.context.storage.traces import load_trace, stats_overview
from satchel.server.context.watch import WatchedCall
from satchel.server.platform.api.messages import timestamp_message, value_message
from satchel.server.platform.api.validation import (
    MAX_BUDGET_TOKENS,
    MAX_QUERY_CHARS,
    check_consistency_token,
    check_id,
    check_text,
    check_timestamp,
    parse_uuid,
)
from satchel.server.platform.config import recall_floor
from satchel.server.platform.errors import InvalidArgument, NotFound, Unavailable, Violations
from satchel.server.platform.runtime import RuntimeRef
from satchel.v1 import context_pb2 as pb
from satchel.v1 import context_pb2_grpc

KINDS = {packing.FACT: pb.CANDIDATE_KIND_FACT, packing.EPISODE: pb.CANDIDATE_KIND_EPISODE}
OUTCOMES = {
    packing.INCLUDED: pb.DECISION_OUTCOME_INCLUDED,
    packing.EXCLUDED: pb.DECISION_OUTCOME_EXCLUDED,
    packing.BLOCKED: pb.DECISION_OUTCOME_BLOCKED,
}
STATUSES = {
    packing.STATUS_OK: pb.PACKET_STATUS_OK,
    packing.STATUS_DEGRADED: pb.PACKET_STATUS_DEGRADED,
}
REASONS = {
    packing.RELEVANCE: pb.REASON_CODE_RELEVANCE,
    packing.MULTI_HOP_EXPANSION: pb.REASON_CODE_MULTI_HOP_EXPANSION,
    packing.OVER_BUDGET: pb.REASON_CODE_OVER_BUDGET,
    packing.BELOW_RELEVANCE_FLOOR: pb.REASON_CODE_BELOW_RELEVANCE_FLOOR,
    packing.CONFLICT_OPEN: pb.REASON_CODE_CONFLICT_OPEN,
    packing.VOLATILITY_EXPIRED: pb.REASON_CODE_VOLATILITY_EXPIRED,
    packing.SOURCE_ALREADY_SERVED: pb.REASON_CODE_SOURCE_ALREADY_SERVED,
    packing.SOURCE_FACTS_HIDDEN: pb.REASON_CODE_SOURCE_FACTS_HIDDEN,
}
"""`Decision.reason` by `Decision.reason_code`; a code missing here is sent UNSPECIFIED."""


def reason_enum(reason_code: str) -> pb.ReasonCode:
    """The ReasonCode of a reason string (UNSPECIFIED for one without an enum value)."""
    return REASONS.get(reason_code, pb.REASON_CODE_UNSPECIFIED)


# StreamContextRequest.max_decisions_per_message's limit.
MAX_DECISIONS_PER_MESSAGE = 256


def decision_message(d: packing.Decision) -> pb.Decision:
    """A domain decision as the wire Decision."""
    c = d.candidate
    return pb.Decision(
        sequence=d.sequence,
        candidate_id=c.id,
        candidate_kind=KINDS[c.kind],
        outcome=OUTCOMES[d.outcome],
        reason_code=d.reason_code,
        reason=reason_enum(d.reason_code),
        score=c.score,
        similarity=c.similarity,
        text_rank=c.text_rank,
        recency=c.recency,
        tokens=c.tokens,
        budget_used=d.budget_used,
        preview=c.text[:PREVIEW_CHARS],
    )


def packet_message(packet: Packet) -> pb.ContextPacket:
    """A domain packet as the wire ContextPacket."""
    return pb.ContextPacket(
        facts=[
            pb.PacketFact(
                id=f.id,
                predicate=f.predicate,
                value=value_message(f.value),
                statement=f.statement,
                confidence=f.confidence,
                valid_from=timestamp_message(f.valid_from),
                source_event_ids=f.source_event_ids,
            )
            for f in packet.facts
        ],
        episodes=[
            pb.PacketEpisode(
                event_id=e.event_id,
                kind=e.kind,
                occurred_at=timestamp_message(e.occurred_at),
                excerpt=e.excerpt,
            )
            for e in packet.episodes
        ],
        warnings=packet.warnings,
        status=STATUSES[packet.status],
        empty_reason=packet.empty_reason,
        budget_tokens=packet.budget_tokens,
        tokens_used=packet.tokens_used,
        block=packet.block,
        token_counter=packet.token_counter,
    )


async def stream_messages(
    items: AsyncIterator[packing.Decision | PassEnd | Packet], trace_id: str, per_message: int
) -> AsyncIterator[pb.StreamContextResponse]:
    """StreamContext's messages: each decision alone (`per_message` 0 or 1), or the first alone
    then batches of at most `per_message`, each sent when full or when its pass ends."""
    batch: list[pb.Decision] = []
    first = True
    async for item in items:
        if isinstance(item, packing.Decision):
            if per_message <= 1:
                yield pb.StreamContextResponse(trace_id=trace_id, decision=decision_message(item))
                continue
            batch.append(decision_message(item))
            if not first and len(batch) < per_message:
                continue
            first = False
        elif not batch and isinstance(item, PassEnd):
            continue
        if batch:  # full, the first decision, its pass ended, or the packet comes
            yield pb.StreamContextResponse(
                trace_id=trace_id, decisions=pb.DecisionBatch(decisions=batch)
            )
            batch = []
        if isinstance(item, Packet):
            yield pb.StreamContextResponse(trace_id=trace_id, packet=packet_message(item))


class ContextServicer(context_pb2_grpc.ContextServiceServicer):
    """Thin adapter over `satchel.server.context.service.assemble` and the trace store."""

    def __init__(self, runtime: RuntimeRef) -> None:
        self._runtime = runtime

    def _request(
        self, request: pb.AssembleContextRequest | pb.StreamContextRequest
    ) -> ContextRequest:
        violations = Violations()
        check_id(violations, "project_id", request.project_id)
        check_id(violations, "subject_id", request.subject_id)
        check_text(violations, "query", request.query, max_chars=MAX_QUERY_CHARS, required=True)
        as_of = check_timestamp(
            violations, "as_of", request.as_of, present=request.HasField("as_of")
        )
        token = check_consistency_token(
            violations, "min_consistency_token", request.min_consistency_token
        )
        runtime = self._runtime()
        settings = runtime.settings.context
        if request.HasField("max_distance"):
            max_distance = request.max_distance
            if not 0.0 <= max_distance <= 2.0:  # NaN too
                violations.add("max_distance", "must be a cosine distance in [0, 2] (0: off)")
        else:
            max_distance = recall_floor(settings, runtime.embedder.model_id)
        if (
            isinstance(request, pb.StreamContextRequest)
            and request.max_decisions_per_message > MAX_DECISIONS_PER_MESSAGE
        ):
            violations.add(
                "max_decisions_per_message", f"must be at most {MAX_DECISIONS_PER_MESSAGE}"
            )
        violations.raise_if_any()
        budget = (
            request.budget_tokens
            if request.HasField("budget_tokens")
            else settings.default_budget_tokens
        )
        if not 0 < budget <= MAX_BUDGET_TOKENS:
            raise InvalidArgument(
                [("budget_tokens", f"must be a positive integer at most {MAX_BUDGET_TOKENS}")],
                reason="BUDGET_EXCEEDED",
            )
        return ContextRequest(
            project_id=request.project_id,
            subject_id=request.subject_id,
            query=request.query,
            budget_tokens=budget,
            as_of=as_of,
            max_distance=max_distance,
            min_consistency_token=token,
        )

    async def AssembleContext(
        self,
        request: pb.AssembleContextRequest,
        context: grpc.aio.ServicerContext[pb.AssembleContextRequest, pb.AssembleContextResponse],
    ) -> pb.AssembleContextResponse:
        call = self._request(request)
        trace_id = new_trace_id()
        structlog.contextvars.bind_contextvars(satchel_trace_id=str(trace_id))
        async for item in assemble(self._runtime(), call, trace_id):
            if isinstance(item, Packet):
                return pb.AssembleContextResponse(
                    packet=packet_message(item), trace_id=item.trace_id
                )
        raise AssertionError("assemble ended without a packet")

    async def StreamContext(
        self,
        request: pb.StreamContextRequest,
        context: grpc.aio.ServicerContext[pb.StreamContextRequest, pb.StreamContextResponse],
    ) -> AsyncIterator[pb.StreamContextResponse]:
        call = self._request(request)
        trace_id = new_trace_id()
        structlog.contextvars.bind_contextvars(satchel_trace_id=str(trace_id))
        items = assemble(self._runtime(), call, trace_id)
        async for message in stream_messages(
            items, str(trace_id), request.max_decisions_per_message
        ):
            yield message

    async def GetTrace(
        self,
        request: pb.GetTraceRequest,
        context: grpc.aio.ServicerContext[pb.GetTraceRequest, pb.GetTraceResponse],
    ) -> pb.GetTraceResponse:
        violations = Violations()
        check_id(violations, "project_id", request.project_id)
        trace_id = parse_uuid(violations, "trace_id", request.trace_id)
        violations.raise_if_any()
        assert trace_id is not None
        runtime = self._runtime()
        reads = runtime.reads
        target = await reads.choose()
        found = await reads.run(target, load_trace, request.project_id, trace_id)
        if found is None and target is not reads.primary:  # perhaps not replayed there yet
            found = await reads.run(reads.primary, load_trace, request.project_id, trace_id)
        if found is None:
            horizon = await reads.run(reads.primary, retention.expired_before)
            made = issued_at(trace_id)
            if made is not None and horizon is not None and made < horizon:
                days = runtime.settings.trace_retention_days
                raise NotFound(
                    f"trace {request.trace_id} expired: traces are kept {days} to {days + 1}"
                    " days (SATCHEL_TRACE_RETENTION_DAYS)",
                    reason="TRACE_EXPIRED",
                )
            raise NotFound(f"no trace {request.trace_id} in this project", reason="TRACE_NOT_FOUND")
        call, decisions = found
        return pb.GetTraceResponse(trace=trace_message(call, decisions))

    async def WatchTraces(
        self,
        request: pb.WatchTracesRequest,
        context: grpc.aio.ServicerContext[pb.WatchTracesRequest, pb.WatchTracesResponse],
    ) -> AsyncIterator[pb.WatchTracesResponse]:
        violations = Violations()
        check_id(violations, "project_id", request.project_id)
        subject = request.subject_id if request.HasField("subject_id") else None
        if subject is not None:
            check_id(violations, "subject_id", subject)
        violations.raise_if_any()
        hub = self._runtime().traces
        if hub is None:
            raise Unavailable("this server does not watch traces", reason="NOT_READY")
        async with hub.watch(request.project_id, subject) as watcher:
            # The client may wait for these headers: every call committed from now on is sent
            # (or counted in dropped_traces).
            await context.send_initial_metadata(())
            async for call in hub.calls(watcher):
                for message in watch_messages(call, watcher.dropped):
                    turn = await hub.turns.take()
                    try:
                        yield message  # written before the generator resumes
                    finally:
                        turn.release()
        raise Unavailable("the server is stopping: watch again", reason="SHUTTING_DOWN")

    async def GetStatsOverview(
        self,
        request: pb.GetStatsOverviewRequest,
        context: grpc.aio.ServicerContext[pb.GetStatsOverviewRequest, pb.GetStatsOverviewResponse],
    ) -> pb.GetStatsOverviewResponse:
        violations = Violations()
        check_id(violations, "project_id", request.project_id)
        violations.raise_if_any()
        row = await self._runtime().reads.read(stats_overview, request.project_id)
        calls = int(row["context_calls"])
        rate = row["calls_serving_facts"] / calls if calls else 0.0
        return pb.GetStatsOverviewResponse(
            injection_rate=rate,
            hit_rate=rate,
            context_calls=calls,
            calls_serving_facts=int(row["calls_serving_facts"]),
            calls_empty=int(row["calls_empty"]),
            latency_p50_ms=float(row["p50"]),
            latency_p95_ms=float(row["p95"]),
            latency_p99_ms=float(row["p99"]),
            mean_tokens_used=float(row["mean_tokens_used"]),
        )


def watch_messages(call: WatchedCall, dropped: int) -> list[pb.WatchTracesResponse]:
    """A watched call's messages, its decisions in order and then its packet: built once for
    all its watchers; copies carry `dropped_traces` for a watcher that has dropped calls."""
    if not call.messages:
        trace_id, subject_id = call.trace_id, call.subject_id
        call.messages.extend(
            pb.WatchTracesResponse(
                trace_id=trace_id, subject_id=subject_id, decision=decision_row_message(row)
            )
            for row in call.decisions
        )
        call.messages.append(
            pb.WatchTracesResponse(
                trace_id=trace_id, subject_id=subject_id, packet=packet_message(call.packet)
            )
        )
    if not dropped:
        return call.messages
    copies = []
    for message in call.messages:
        copy = pb.WatchTracesResponse(dropped_traces=dropped)
        copy.MergeFrom(message)
        copies.append(copy)
    return copies


def trace_message(call: dict[str, Any], decisions: list[dict[str, Any]]) -> pb.Trace:
    """A persisted call and its decision rows as the wire Trace."""
    return pb.Trace(
        trace_id=str(call["trace_id"]),
        project_id=call["project_id"],
        subject_id=call["subject_id"],
        query=call["query"],
        budget_tokens=call["budget_tokens"],
        created_at=timestamp_message(call["created_at"]),
        as_of=timestamp_message(call["as_of"]),
        status=STATUSES[call["status"]],
        warnings=call["warnings"],
        empty_reason=call["empty_reason"],
        tokens_used=call["tokens_used"],
        timings=pb.TraceTimings(
            embed_ms=call["embed_ms"],
            retrieve_ms=call["retrieve_ms"],
            pack_ms=call["pack_ms"],
            total_ms=call["total_ms"],
        ),
        decisions=[decision_row_message(d) for d in decisions],
    )


def decision_row_message(d: dict[str, Any]) -> pb.Decision:
    """A persisted decision row as the wire Decision."""
    return pb.Decision(
        sequence=d["sequence"],
        candidate_id=str(d["candidate_id"]),
        candidate_kind=KINDS[d["candidate_kind"]],
        outcome=OUTCOMES[d["outcome"]],
        reason_code=d["reason_code"],
        reason=reason_enum(d["reason_code"]),
        score=d["score"],
        similarity=d["similarity"],
        text_rank=d["text_rank"],
        recency=d["recency"],
        tokens=d["tokens"],
        budget_used=d["budget_used"],
        preview=d["preview"],
    )
