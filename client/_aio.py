"""`AsyncSatchelClient`: the asyncio client (grpc.aio), the same methods as `SatchelClient`.

This file is the SDK's source of truth: the blocking client, `client/_sync.py`, is generated
from it by `scripts/generate-sync-client` (`async def` -> `def`, `await x` -> `x`, `AsyncStream`
-> `Stream`, `grpc.aio.*` -> `grpc.*`, ...), with the few pieces that genuinely differ (the
`Stream` class, some docstrings) written by hand in `client/_sync_parts.py`. Change this file,
then run the script: `tests/sdk/test_sdk_generated.py` fails while `_sync.py` is not its output.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any, Generic, TypeVar

import grpc
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2

from satchel.client import requests as rq
from satchel.client._common import (
    DEFAULT_ADDRESS,
    DEFAULT_TIMEOUT,
    HEALTH_CHECK,
    Metadata,
    RetryPolicy,
    call_metadata,
    channel_options,
    channel_target,
    health_status,
)
from satchel.client.errors import SatchelError
from satchel.v1 import (
    context_pb2,
    context_pb2_grpc,
    memory_pb2,
    memory_pb2_grpc,
    talent_pb2,
    talent_pb2_grpc,
)

T = TypeVar("T")
R = TypeVar("R", bound=Message)


class AsyncStream(Generic[T]):
    """A server stream: `async for` the messages; `cancel()` (or leaving `async with`) ends it.

    Errors are raised as `SatchelError` while iterating; after `cancel()` iteration just stops.
    """

    def __init__(self, call: grpc.aio.UnaryStreamCall[Any, T]) -> None:
        self._call = call
        self._messages: AsyncIterator[T] = call.__aiter__()
        self._cancelled = False

    def __aiter__(self) -> AsyncIterator[T]:
        return self

    async def __anext__(self) -> T:
        try:
            return await self._messages.__anext__()
        except grpc.aio.AioRpcError as exc:
            if self._cancelled and exc.code() == grpc.StatusCode.CANCELLED:
                raise StopAsyncIteration from None
            raise SatchelError.from_rpc_error(exc) from exc
        except asyncio.CancelledError:
            if self._cancelled:
                raise StopAsyncIteration from None
            raise

    def cancel(self) -> None:
        """Cancel the call; the server stops sending."""
        self._cancelled = True
        self._call.cancel()

    async def __aenter__(self) -> AsyncStream[T]:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.cancel()


class AsyncSatchelClient:
    """Asyncio client of a satchel server; create it inside a running event loop.

    Same methods, arguments and results as `SatchelClient`, awaited (streams are
    `AsyncStream`s to `async for`); failures raise `SatchelError`.
    """

    def __init__(
        self,
        address: str | Sequence[str] = DEFAULT_ADDRESS,
        *,
        api_key: str | None = None,
        timeout: float | None = DEFAULT_TIMEOUT,
        retry: RetryPolicy | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        channel: grpc.aio.Channel | None = None,
        options: Sequence[tuple[str, Any]] = (),
        metadata: Metadata = (),
    ) -> None:
        self.address = address if isinstance(address, str) else tuple(address)
        self.target = channel_target(address)
        """The gRPC target of the channel (several addresses: `ipv4:a:p,b:p,…`)."""
        self.timeout = timeout
        self.retry = retry or RetryPolicy()
        self._metadata = call_metadata(api_key, metadata)
        self._own_channel = channel is None
        if channel is None:
            settings = channel_options(self.retry, options)
            channel = (
                grpc.aio.secure_channel(self.target, credentials, options=settings)
                if credentials is not None
                else grpc.aio.insecure_channel(self.target, options=settings)
            )
        self.channel = channel
        self._context = context_pb2_grpc.ContextServiceStub(channel)
        self._memory = memory_pb2_grpc.MemoryServiceStub(channel)
        self._talents = talent_pb2_grpc.TalentServiceStub(channel)
        self._health = channel.unary_unary(
            HEALTH_CHECK,
            request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
            response_deserializer=health_pb2.HealthCheckResponse.FromString,
        )

    async def close(self) -> None:
        """Close the channel (only when the client created it)."""
        if self._own_channel:
            await self.channel.close()

    async def __aenter__(self) -> AsyncSatchelClient:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    # --- plumbing ---------------------------------------------------------------------------

    async def _unary(
        self, rpc: Callable[..., Any], request: Message, timeout: float | None, reply: type[R]
    ) -> R:
        """One unary call (gRPC retries it per the channel's service config), errors as
        `SatchelError`."""
        try:
            response = await rpc(
                request,
                timeout=self.timeout if timeout is None else timeout,
                metadata=self._metadata,
            )
        except grpc.aio.AioRpcError as exc:
            raise SatchelError.from_rpc_error(exc) from exc
        if not isinstance(response, reply):
            raise TypeError(f"{type(response).__name__} is not a {reply.__name__}")
        return response

    async def health(self, service: str = "", *, timeout: float | None = None) -> str:
        """The standard health check: `SERVING`, `NOT_SERVING`, `SERVICE_UNKNOWN` or `UNKNOWN`."""
        try:
            reply = await self._health(
                health_pb2.HealthCheckRequest(service=service),
                timeout=self.timeout if timeout is None else timeout,
                metadata=self._metadata,
            )
        except grpc.aio.AioRpcError as exc:
            raise SatchelError.from_rpc_error(exc) from exc
        return health_status(reply)

    # --- ContextService ---------------------------------------------------------------------

    async def assemble_context(
        self,
        project_id: str,
        subject_id: str,
        query: str,
        *,
        budget_tokens: int | None = None,
        as_of: datetime | None = None,
        max_distance: float | None = None,
        min_consistency_token: str = "",
        timeout: float | None = None,
    ) -> context_pb2.AssembleContextResponse:
        """The context packet of a query and the id of its persisted trace."""
        request = rq.assemble_context(
            project_id,
            subject_id,
            query,
            budget_tokens=budget_tokens,
            as_of=as_of,
            max_distance=max_distance,
            min_consistency_token=min_consistency_token,
        )
        return await self._unary(
            self._context.AssembleContext, request, timeout, context_pb2.AssembleContextResponse
        )

    def stream_context(
        self,
        project_id: str,
        subject_id: str,
        query: str,
        *,
        budget_tokens: int | None = None,
        as_of: datetime | None = None,
        max_distance: float | None = None,
        max_decisions_per_message: int = 0,
        min_consistency_token: str = "",
        timeout: float | None = None,
    ) -> AsyncStream[context_pb2.StreamContextResponse]:
        """The decisions as the budget is packed, then the packet (last): one decision a
        message, or with `max_decisions_per_message` above 1, batches in `decisions`."""
        request = rq.stream_context(
            project_id,
            subject_id,
            query,
            budget_tokens=budget_tokens,
            as_of=as_of,
            max_distance=max_distance,
            max_decisions_per_message=max_decisions_per_message,
            min_consistency_token=min_consistency_token,
        )
        call = self._context.StreamContext(
            request, timeout=self.timeout if timeout is None else timeout, metadata=self._metadata
        )
        return AsyncStream(call)

    async def get_trace(
        self, project_id: str, trace_id: str, *, timeout: float | None = None
    ) -> context_pb2.GetTraceResponse:
        """The persisted trace of an earlier context call."""
        request = context_pb2.GetTraceRequest(project_id=project_id, trace_id=trace_id)
        return await self._unary(
            self._context.GetTrace, request, timeout, context_pb2.GetTraceResponse
        )

    def watch_traces(
        self, project_id: str, *, subject_id: str | None = None, timeout: float | None = None
    ) -> AsyncStream[context_pb2.WatchTracesResponse]:
        """Live decisions of every context call of a project (or one subject); no deadline
        unless `timeout` is given."""
        request = context_pb2.WatchTracesRequest(project_id=project_id, subject_id=subject_id)
        return AsyncStream(
            self._context.WatchTraces(request, timeout=timeout, metadata=self._metadata)
        )

    async def get_stats_overview(
        self, project_id: str, *, timeout: float | None = None
    ) -> context_pb2.GetStatsOverviewResponse:
        """Injection rate, call counts and latency figures of a project."""
        request = context_pb2.GetStatsOverviewRequest(project_id=project_id)
        return await self._unary(
            self._context.GetStatsOverview, request, timeout, context_pb2.GetStatsOverviewResponse
        )

    # --- MemoryService ----------------------------------------------------------------------

    async def record_event(
        self,
        project_id: str,
        subject_id: str,
        kind: str,
        payload: Mapping[str, Any] | None = None,
        *,
        occurred_at: datetime | None = None,
        idempotency_key: str = "",
        timeout: float | None = None,
    ) -> memory_pb2.RecordEventResponse:
        """Store one event of a scope (a repeated idempotency key returns the first one)."""
        request = rq.event_request(
            project_id,
            subject_id,
            kind,
            payload,
            occurred_at=occurred_at,
            idempotency_key=idempotency_key,
        )
        return await self._unary(
            self._memory.RecordEvent, request, timeout, memory_pb2.RecordEventResponse
        )

    async def batch_record_events(
        self, requests: Iterable[memory_pb2.RecordEventRequest], *, timeout: float | None = None
    ) -> memory_pb2.BatchRecordEventsResponse:
        """Store many events in one transaction (build items with `event_request`)."""
        request = memory_pb2.BatchRecordEventsRequest(requests=list(requests))
        return await self._unary(
            self._memory.BatchRecordEvents, request, timeout, memory_pb2.BatchRecordEventsResponse
        )

    async def list_events(
        self,
        project_id: str,
        subject_id: str,
        *,
        as_of: datetime | None = None,
        page_size: int = 0,
        page_token: str = "",
        min_consistency_token: str = "",
        timeout: float | None = None,
    ) -> memory_pb2.ListEventsResponse:
        """One page of the events of a scope, newest first."""
        request = rq.list_events(
            project_id,
            subject_id,
            as_of=as_of,
            page_size=page_size,
            page_token=page_token,
            min_consistency_token=min_consistency_token,
        )
        return await self._unary(
            self._memory.ListEvents, request, timeout, memory_pb2.ListEventsResponse
        )

    async def iter_events(
        self,
        project_id: str,
        subject_id: str,
        *,
        as_of: datetime | None = None,
        page_size: int = 0,
    ) -> AsyncIterator[memory_pb2.Event]:
        """Every event of a scope, newest first, page after page."""
        token = ""
        while True:
            page = await self.list_events(
                project_id, subject_id, as_of=as_of, page_size=page_size, page_token=token
            )
            for item in page.events:
                yield item
            if not (token := page.next_page_token):
                return

    async def assert_fact(
        self,
        project_id: str,
        subject_id: str,
        predicate: str,
        value: Any,
        *,
        statement: str = "",
        confidence: float | None = None,
        valid_from: datetime | None = None,
        valid_to: datetime | None = None,
        source_event_ids: Iterable[str] = (),
        stale_after: timedelta | None = None,
        idempotency_key: str = "",
        supersedes_fact_ids: Iterable[str] = (),
        timeout: float | None = None,
    ) -> memory_pb2.AssertFactResponse:
        """Store an active fact; `value` is any JSON-like value."""
        request = rq.fact_request(
            project_id,
            subject_id,
            predicate,
            value,
            statement=statement,
            confidence=confidence,
            valid_from=valid_from,
            valid_to=valid_to,
            source_event_ids=source_event_ids,
            stale_after=stale_after,
            idempotency_key=idempotency_key,
            supersedes_fact_ids=supersedes_fact_ids,
        )
        return await self._unary(
            self._memory.AssertFact, request, timeout, memory_pb2.AssertFactResponse
        )

    async def batch_assert_facts(
        self, requests: Iterable[memory_pb2.AssertFactRequest], *, timeout: float | None = None
    ) -> memory_pb2.BatchAssertFactsResponse:
        """Store many facts in one transaction (build items with `fact_request`)."""
        request = memory_pb2.BatchAssertFactsRequest(requests=list(requests))
        return await self._unary(
            self._memory.BatchAssertFacts, request, timeout, memory_pb2.BatchAssertFactsResponse
        )

    async def retire_fact(
        self, project_id: str, fact_id: str, reason: str = "", *, timeout: float | None = None
    ) -> memory_pb2.RetireFactResponse:
        """Mark a fact retired (kept for history and as-of reads)."""
        request = memory_pb2.RetireFactRequest(
            project_id=project_id, fact_id=fact_id, reason=reason
        )
        return await self._unary(
            self._memory.RetireFact, request, timeout, memory_pb2.RetireFactResponse
        )

    async def delete_event(
        self, project_id: str, event_id: str, *, timeout: float | None = None
    ) -> memory_pb2.DeleteEventResponse:
        """Forget an event for good (not retirement): the facts drawn only from it go too, and
        the trace decisions quoting either. Idempotent: an unknown event deletes nothing
        (`deleted` counts are 0); never retried by the client, repeat it yourself."""
        request = memory_pb2.DeleteEventRequest(project_id=project_id, event_id=event_id)
        return await self._unary(
            self._memory.DeleteEvent, request, timeout, memory_pb2.DeleteEventResponse
        )

    async def delete_subject(
        self, project_id: str, subject_id: str, *, timeout: float | None = None
    ) -> memory_pb2.DeleteSubjectResponse:
        """Forget every event, fact, conflict and trace of one scope (idempotent)."""
        request = memory_pb2.DeleteSubjectRequest(project_id=project_id, subject_id=subject_id)
        return await self._unary(
            self._memory.DeleteSubject, request, timeout, memory_pb2.DeleteSubjectResponse
        )

    async def delete_project(
        self, project_id: str, *, timeout: float | None = None
    ) -> memory_pb2.DeleteProjectResponse:
        """Forget every scope of a project (idempotent); its API keys and talents stay."""
        request = memory_pb2.DeleteProjectRequest(project_id=project_id)
        return await self._unary(
            self._memory.DeleteProject, request, timeout, memory_pb2.DeleteProjectResponse
        )

    async def supersede_fact(
        self,
        project_id: str,
        fact_id: str,
        superseded_by_fact_id: str,
        *,
        timeout: float | None = None,
    ) -> memory_pb2.SupersedeFactResponse:
        """Mark a fact superseded by another active fact of the same scope."""
        request = memory_pb2.SupersedeFactRequest(
            project_id=project_id, fact_id=fact_id, superseded_by_fact_id=superseded_by_fact_id
        )
        return await self._unary(
            self._memory.SupersedeFact, request, timeout, memory_pb2.SupersedeFactResponse
        )

    async def list_facts(
        self,
        project_id: str,
        subject_id: str,
        *,
        as_of: datetime | None = None,
        include_inactive: bool = False,
        page_size: int = 0,
        page_token: str = "",
        min_consistency_token: str = "",
        timeout: float | None = None,
    ) -> memory_pb2.ListFactsResponse:
        """One page of the facts of a scope, now or as they stood at `as_of`."""
        request = rq.list_facts(
            project_id,
            subject_id,
            as_of=as_of,
            include_inactive=include_inactive,
            page_size=page_size,
            page_token=page_token,
            min_consistency_token=min_consistency_token,
        )
        return await self._unary(
            self._memory.ListFacts, request, timeout, memory_pb2.ListFactsResponse
        )

    async def iter_facts(
        self,
        project_id: str,
        subject_id: str,
        *,
        as_of: datetime | None = None,
        include_inactive: bool = False,
        page_size: int = 0,
    ) -> AsyncIterator[memory_pb2.Fact]:
        """Every fact of a scope (see `list_facts`), page after page."""
        token = ""
        while True:
            page = await self.list_facts(
                project_id,
                subject_id,
                as_of=as_of,
                include_inactive=include_inactive,
                page_size=page_size,
                page_token=token,
            )
            for item in page.facts:
                yield item
            if not (token := page.next_page_token):
                return

    async def open_conflict(
        self,
        project_id: str,
        subject_id: str,
        fact_ids: Iterable[str],
        note: str = "",
        *,
        timeout: float | None = None,
    ) -> memory_pb2.OpenConflictResponse:
        """Group facts whose values disagree; they are blocked from context until resolved."""
        request = memory_pb2.OpenConflictRequest(
            project_id=project_id, subject_id=subject_id, fact_ids=list(fact_ids), note=note
        )
        return await self._unary(
            self._memory.OpenConflict, request, timeout, memory_pb2.OpenConflictResponse
        )

    async def resolve_conflict(
        self,
        project_id: str,
        conflict_id: str,
        winning_fact_id: str,
        *,
        timeout: float | None = None,
    ) -> memory_pb2.ResolveConflictResponse:
        """Close a conflict with a winner; the other members become superseded."""
        request = memory_pb2.ResolveConflictRequest(
            project_id=project_id, conflict_id=conflict_id, winning_fact_id=winning_fact_id
        )
        return await self._unary(
            self._memory.ResolveConflict, request, timeout, memory_pb2.ResolveConflictResponse
        )

    async def list_conflicts(
        self,
        project_id: str,
        subject_id: str,
        *,
        include_resolved: bool = False,
        page_size: int = 0,
        page_token: str = "",
        min_consistency_token: str = "",
        timeout: float | None = None,
    ) -> memory_pb2.ListConflictsResponse:
        """One page of the conflicts of a scope (open ones, or all with `include_resolved`),
        newest first."""
        request = rq.list_conflicts(
            project_id,
            subject_id,
            include_resolved=include_resolved,
            page_size=page_size,
            page_token=page_token,
            min_consistency_token=min_consistency_token,
        )
        return await self._unary(
            self._memory.ListConflicts, request, timeout, memory_pb2.ListConflictsResponse
        )

    async def iter_conflicts(
        self,
        project_id: str,
        subject_id: str,
        *,
        include_resolved: bool = False,
        page_size: int = 0,
    ) -> AsyncIterator[memory_pb2.Conflict]:
        """Every conflict of a scope (see `list_conflicts`), page after page."""
        token = ""
        while True:
            page = await self.list_conflicts(
                project_id,
                subject_id,
                include_resolved=include_resolved,
                page_size=page_size,
                page_token=token,
            )
            for item in page.conflicts:
                yield item
            if not (token := page.next_page_token):
                return

    # --- TalentService ----------------------------------------------------------------------

    async def upsert_talent(
        self, talent: talent_pb2.Talent, *, timeout: float | None = None
    ) -> talent_pb2.UpsertTalentResponse:
        """Create or replace a talent of the catalogue."""
        request = talent_pb2.UpsertTalentRequest(talent=talent)
        return await self._unary(
            self._talents.UpsertTalent, request, timeout, talent_pb2.UpsertTalentResponse
        )

    async def list_talents(
        self,
        project_id: str = "",
        *,
        active_only: bool = False,
        page_size: int = 0,
        page_token: str = "",
        timeout: float | None = None,
    ) -> talent_pb2.ListTalentsResponse:
        """One page of the catalogue by id, or with `project_id` also which of the page's talents
        are active there."""
        request = rq.list_talents(
            project_id, active_only=active_only, page_size=page_size, page_token=page_token
        )
        return await self._unary(
            self._talents.ListTalents, request, timeout, talent_pb2.ListTalentsResponse
        )

    async def iter_talents(
        self, project_id: str = "", *, active_only: bool = False, page_size: int = 0
    ) -> AsyncIterator[talent_pb2.Talent]:
        """Every talent of the catalogue (or of a project's active set), page after page."""
        token = ""
        while True:
            page = await self.list_talents(
                project_id, active_only=active_only, page_size=page_size, page_token=token
            )
            for item in page.talents:
                yield item
            if not (token := page.next_page_token):
                return

    async def set_talent_activation(
        self, project_id: str, talent_id: str, active: bool = True, *, timeout: float | None = None
    ) -> talent_pb2.SetTalentActivationResponse:
        """Turn a talent on (or off) for a project."""
        request = talent_pb2.SetTalentActivationRequest(
            project_id=project_id, talent_id=talent_id, active=active
        )
        return await self._unary(
            self._talents.SetTalentActivation,
            request,
            timeout,
            talent_pb2.SetTalentActivationResponse,
        )

    async def resolve_talents(
        self,
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
        timeout: float | None = None,
    ) -> talent_pb2.ResolveTalentsResponse:
        """The talents an agent of `role` receives for `task` (`.selection`)."""
        request = rq.resolve_talents(
            project_id,
            task,
            role=role,
            relevance=relevance,
            budget_tokens=budget_tokens,
            floor=floor,
            beta=beta,
            margin=margin,
            max_served=max_served,
        )
        return await self._unary(
            self._talents.ResolveTalents, request, timeout, talent_pb2.ResolveTalentsResponse
        )

    async def search_tools(
        self,
        project_id: str,
        task: str,
        *,
        role: str = "",
        budget_tokens: int | None = None,
        max_served: int | None = None,
        timeout: float | None = None,
    ) -> talent_pb2.SearchToolsResponse:
        """The tools an agent of `role` should load for `task` (name, description, input
        schema), or `none_fits`."""
        request = rq.search_tools(
            project_id, task, role=role, budget_tokens=budget_tokens, max_served=max_served
        )
        return await self._unary(
            self._talents.SearchTools, request, timeout, talent_pb2.SearchToolsResponse
        )

    async def diagnose_project(
        self, project_id: str, roles: Iterable[str] = (), *, timeout: float | None = None
    ) -> talent_pb2.DiagnoseProjectResponse:
        """What is wrong with a project's talents (the doctor)."""
        request = talent_pb2.DiagnoseProjectRequest(project_id=project_id, roles=list(roles))
        return await self._unary(
            self._talents.DiagnoseProject, request, timeout, talent_pb2.DiagnoseProjectResponse
        )
