"""`satchel mcp`: satchel's memory, context and tool search for MCP hosts.

An adapter on the official `mcp` SDK and nothing more: each MCP tool calls one RPC of a running
satchel server through the asyncio SDK (`satchel.client`) and words its answer for a model; no
retrieval, ranking or selection happens here. Tools, resources and prompts:

- tools named after their RPCs (`assemble_context`, `record_event`, `assert_fact`,
  `supersede_fact`, `retire_fact`, `list_facts`, `delete_event`, `delete_subject`,
  `resolve_talents` (SearchTools), `get_trace`), each answering with text for the model and the
  RPC's response as structured content (proto field names);
- resources `satchel://trace/{trace_id}` (a trace as JSON) and `satchel://facts/{subject_id}`
  (a scope's active facts), in the configured project;
- the prompt `context_for_task`: a task preceded by the memory block satchel assembles for it.

The project and subject of a call come from `McpOptions` (flags or environment) unless the call
names others; `pinned` removes those overrides from the tools' schemas. A failed RPC is a tool
error naming its gRPC status and field violations; a server that is down is one too, and the
MCP server keeps running. Over HTTP each caller brings its own satchel API key
(`Authorization: Bearer KEY`), checked against satchel before the request reaches a tool
(`BearerKeyCheck`).
"""

from __future__ import annotations

import functools
import inspect
import json
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any, TypeVar

import grpc
from google.protobuf import json_format
from google.protobuf.message import Message
from mcp.server import MCPServer
from mcp.server.mcpserver import Context, UserMessage
from mcp.server.mcpserver.exceptions import ResourceError, ToolError
from mcp_types import CallToolResult, TextContent, ToolAnnotations
from pydantic import Field

from satchel import __version__
from satchel.client import DEFAULT_TIMEOUT, AsyncSatchelClient, SatchelError, render_packet
from satchel.v1 import context_pb2, memory_pb2, talent_pb2

T = TypeVar("T")

INSTRUCTIONS = """\
satchel keeps a long-term memory per project and subject (a user, an agent, a conversation) and \
assembles from it, under a token budget, what is relevant to a query. Call assemble_context at \
the start of a task and put its <satchel_memory> block in your context. Record what happens with \
record_event and what is true with assert_fact (a short statement in words makes a fact \
findable). resolve_talents says which tools of the catalogue fit a task, or that none does. \
get_trace explains why each memory was served or left out."""

MAX_CALLER_CLIENTS = 64
"""Distinct callers' keys whose SDK clients are kept (HTTP); they share one channel."""

KEY_CHECK_SECONDS = 5.0
"""How long a caller's key, once checked with satchel, is trusted (HTTP); as satchel's own
key cache (SATCHEL_AUTH_CACHE_SECONDS)."""

READ = ToolAnnotations(read_only_hint=True, destructive_hint=False, open_world_hint=False)
WRITE = ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=False)
DELETE = ToolAnnotations(
    read_only_hint=False, destructive_hint=True, idempotent_hint=True, open_world_hint=False
)

ProjectOverride = Annotated[
    str | None,
    Field(description="Another project than the configured one (rarely needed)."),
]
SubjectOverride = Annotated[
    str | None,
    Field(description="Another subject (user, agent, conversation) than the configured one."),
]
Instant = Annotated[
    datetime | None,
    Field(description="ISO 8601 date or datetime; without a time zone, UTC."),
]


@dataclass(frozen=True)
class McpOptions:
    """Where the satchel server is and which scope the tools address by default."""

    address: str
    api_key: str | None = None
    """The key of every call (stdio); over HTTP each caller sends its own instead."""
    project_id: str = ""
    subject_id: str = ""
    role: str = ""
    """The agent role whose talents `resolve_talents` selects by default."""
    pinned: bool = False
    """The tools offer no project or subject override: the host decides the scope."""
    timeout: float = DEFAULT_TIMEOUT
    http: bool = False


class Gateway:
    """SDK clients of the satchel server, opened lazily inside the MCP server's event loop
    (one channel; one client per caller's key over HTTP), and the scope of a call."""

    def __init__(self, options: McpOptions) -> None:
        self.options = options
        self._shared: AsyncSatchelClient | None = None
        self._callers: OrderedDict[str, AsyncSatchelClient] = OrderedDict()

    def client(self, key: str | None) -> AsyncSatchelClient:
        """The client that calls with `key` (None: no key)."""
        if self._shared is None:
            self._shared = AsyncSatchelClient(self.options.address, timeout=self.options.timeout)
        if not key:
            return self._shared
        client = self._callers.pop(key, None) or AsyncSatchelClient(
            self.options.address,
            api_key=key,
            channel=self._shared.channel,
            timeout=self.options.timeout,
        )
        self._callers[key] = client
        while len(self._callers) > MAX_CALLER_CLIENTS:
            self._callers.popitem(last=False)
        return client

    def for_call(self, ctx: Context | None) -> AsyncSatchelClient:
        """The client of a tool call: the caller's key over HTTP, the configured one on stdio."""
        if not self.options.http:
            return self.client(self.options.api_key)
        headers = ctx.headers if ctx is not None else None
        return self.client(bearer_key(headers or {}))

    def project(self, override: str | None) -> str:
        project = override or self.options.project_id
        if not project:
            raise ToolError(
                "no project: pass project_id, or start `satchel mcp` with --project "
                "(or SATCHEL_PROJECT)"
            )
        return project

    def subject(self, override: str | None) -> str:
        subject = override or self.options.subject_id
        if not subject:
            raise ToolError(
                "no subject: pass subject_id, or start `satchel mcp` with --subject "
                "(or SATCHEL_SUBJECT)"
            )
        return subject

    async def call(self, rpc: Awaitable[T]) -> T:
        """Await an SDK call; a failure becomes a tool error in words."""
        try:
            return await rpc
        except SatchelError as error:
            raise ToolError(describe(error, self.options.address)) from None

    async def close(self) -> None:
        if self._shared is not None:
            await self._shared.close()


def describe(error: SatchelError, address: str) -> str:
    """A failed RPC for a model: its status, message and field violations; a server that
    cannot be reached says so."""
    if error.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return (
            f"{error.code.name}: the satchel server at {address} did not answer "
            f"({error.message}). Is it running (`satchel serve`)? Try again once it is."
        )
    reason = f" [{error.reason}]" if error.reason else ""
    return f"{error}{reason}"


def bearer_key(headers: Mapping[str, str]) -> str | None:
    """The key of an `Authorization: Bearer KEY` header, if any."""
    scheme, _, key = (headers.get("authorization") or "").strip().partition(" ")
    return key.strip() or None if scheme.lower() == "bearer" else None


def as_data(message: Message) -> dict[str, Any]:
    """A response message as JSON data, with proto field names."""
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


def answer(text: str, data: Message | dict[str, Any]) -> CallToolResult:
    """A tool result: `text` for the model, `data` as structured content."""
    structured = data if isinstance(data, dict) else as_data(data)
    return CallToolResult(
        content=[TextContent(type="text", text=text)], structured_content=structured
    )


def utc(moment: datetime | None) -> datetime | None:
    return moment.replace(tzinfo=UTC) if moment is not None and moment.tzinfo is None else moment


class SatchelTools:
    """The MCP tools, resources and prompt: one RPC each, through `Gateway`."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    # --- context ------------------------------------------------------------------------------

    async def assemble_context(
        self,
        query: Annotated[str, Field(description="What the agent is about to do or answer.")],
        budget_tokens: Annotated[
            int | None,
            Field(description="Token budget of the block (default: the server's)."),
        ] = None,
        as_of: Instant = None,
        subject_id: SubjectOverride = None,
        project_id: ProjectOverride = None,
        ctx: Context | None = None,
    ) -> CallToolResult:
        """Assemble what satchel remembers that is relevant to a query, under a token budget.

        Returns the <satchel_memory> block to put in your context (empty when nothing in memory
        is relevant) and the trace id that get_trace explains."""
        g = self.gateway
        reply = await g.call(
            g.for_call(ctx).assemble_context(
                g.project(project_id),
                g.subject(subject_id),
                query,
                budget_tokens=budget_tokens,
                as_of=utc(as_of),
            )
        )
        block = render_packet(reply.packet)
        text = block or "Nothing in memory is relevant to this query."
        data = {"memory": block, **as_data(reply)}
        return answer(f"{text}\n\ntrace_id: {reply.trace_id}", data)

    async def get_trace(
        self,
        trace_id: Annotated[str, Field(description="The trace id of an assemble_context call.")],
        project_id: ProjectOverride = None,
        ctx: Context | None = None,
    ) -> CallToolResult:
        """Explain a context call: for each candidate memory, whether it was served, left out or
        blocked, why (relevance, over_budget, below_relevance_floor, conflict_open, …) and the
        parts of its score."""
        g = self.gateway
        reply = await g.call(g.for_call(ctx).get_trace(g.project(project_id), trace_id))
        return answer(trace_text(reply.trace), as_data(reply.trace))

    # --- memory -------------------------------------------------------------------------------

    async def record_event(
        self,
        kind: Annotated[
            str,
            Field(description='What happened, e.g. "conversation.message", "tool.result".'),
        ],
        payload: Annotated[
            dict[str, Any],
            Field(
                description="The event as a JSON object; its text is found later, e.g. "
                '{"speaker": "user", "text": "I moved to Porto"}.'
            ),
        ],
        occurred_at: Instant = None,
        idempotency_key: Annotated[
            str, Field(description="Repeating a key returns the first event instead of a copy.")
        ] = "",
        subject_id: SubjectOverride = None,
        project_id: ProjectOverride = None,
        ctx: Context | None = None,
    ) -> CallToolResult:
        """Record an event of the subject's history (a message, an action, an observation); its
        text can be served later as an episode."""
        g = self.gateway
        reply = await g.call(
            g.for_call(ctx).record_event(
                g.project(project_id),
                g.subject(subject_id),
                kind,
                payload,
                occurred_at=utc(occurred_at),
                idempotency_key=idempotency_key,
            )
        )
        return answer(f"recorded event {reply.event.id}", reply)

    async def assert_fact(
        self,
        predicate: Annotated[str, Field(description='What the fact is about, e.g. "home_city".')],
        value: Annotated[Any, Field(description="The fact's value: any JSON value.")],
        statement: Annotated[
            str,
            Field(
                description='The fact in one sentence, such as "Maya lives in Porto": what is '
                "searched and served (default: predicate: value)."
            ),
        ] = "",
        confidence: Annotated[float | None, Field(ge=0, le=1)] = None,
        valid_from: Instant = None,
        valid_to: Instant = None,
        source_event_ids: Annotated[
            list[str], Field(description="The events the fact was drawn from.")
        ] = [],  # noqa: B006 (read by pydantic, never mutated)
        supersedes_fact_ids: Annotated[
            list[str], Field(description="Facts this one replaces (they stop being served).")
        ] = [],  # noqa: B006
        idempotency_key: str = "",
        subject_id: SubjectOverride = None,
        project_id: ProjectOverride = None,
        ctx: Context | None = None,
    ) -> CallToolResult:
        """Assert a fact about the subject (active until superseded, retired or no longer
        valid)."""
        g = self.gateway
        reply = await g.call(
            g.for_call(ctx).assert_fact(
                g.project(project_id),
                g.subject(subject_id),
                predicate,
                value,
                statement=statement,
                confidence=confidence,
                valid_from=utc(valid_from),
                valid_to=utc(valid_to),
                source_event_ids=source_event_ids,
                supersedes_fact_ids=supersedes_fact_ids,
                idempotency_key=idempotency_key,
            )
        )
        return answer(f"asserted fact {reply.fact.id}", reply)

    async def supersede_fact(
        self,
        fact_id: Annotated[str, Field(description="The fact that is no longer true.")],
        superseded_by_fact_id: Annotated[
            str, Field(description="The active fact of the same subject that replaces it.")
        ],
        project_id: ProjectOverride = None,
        ctx: Context | None = None,
    ) -> CallToolResult:
        """Mark a fact superseded by another: it is kept for history and no longer served."""
        g = self.gateway
        reply = await g.call(
            g.for_call(ctx).supersede_fact(g.project(project_id), fact_id, superseded_by_fact_id)
        )
        return answer(f"fact {fact_id} superseded by {superseded_by_fact_id}", reply)

    async def retire_fact(
        self,
        fact_id: str,
        reason: Annotated[str, Field(description="Why the fact no longer holds.")] = "",
        project_id: ProjectOverride = None,
        ctx: Context | None = None,
    ) -> CallToolResult:
        """Retire a fact that no longer holds: it is kept for history and no longer served."""
        g = self.gateway
        reply = await g.call(g.for_call(ctx).retire_fact(g.project(project_id), fact_id, reason))
        return answer(f"fact {fact_id} retired", reply)

    async def list_facts(
        self,
        include_inactive: Annotated[
            bool, Field(description="Also superseded, retired and expired facts.")
        ] = False,
        as_of: Instant = None,
        page_size: Annotated[int, Field(ge=0, description="0: the server's default.")] = 0,
        page_token: Annotated[str, Field(description="next_page_token of a previous page.")] = "",
        subject_id: SubjectOverride = None,
        project_id: ProjectOverride = None,
        ctx: Context | None = None,
    ) -> CallToolResult:
        """List the subject's facts (active ones by default), one page at a time."""
        g = self.gateway
        reply = await g.call(
            g.for_call(ctx).list_facts(
                g.project(project_id),
                g.subject(subject_id),
                as_of=utc(as_of),
                include_inactive=include_inactive,
                page_size=page_size,
                page_token=page_token,
            )
        )
        return answer(facts_text(reply), reply)

    async def delete_event(
        self,
        event_id: str,
        project_id: ProjectOverride = None,
        ctx: Context | None = None,
    ) -> CallToolResult:
        """Forget an event for good, with the facts drawn only from it and the traces quoting
        them (not a retirement: nothing is kept)."""
        g = self.gateway
        reply = await g.call(g.for_call(ctx).delete_event(g.project(project_id), event_id))
        return answer(f"event {event_id}: {forgotten(reply.deleted)}", reply)

    async def delete_subject(
        self,
        subject_id: SubjectOverride = None,
        project_id: ProjectOverride = None,
        ctx: Context | None = None,
    ) -> CallToolResult:
        """Forget everything about a subject for good: its events, facts, conflicts and
        traces."""
        g = self.gateway
        subject = g.subject(subject_id)
        reply = await g.call(g.for_call(ctx).delete_subject(g.project(project_id), subject))
        return answer(f"subject {subject}: {forgotten(reply.deleted)}", reply)

    # --- talents ------------------------------------------------------------------------------

    async def resolve_talents(
        self,
        task: Annotated[str, Field(description="The task the tools are for, in words.")],
        role: Annotated[
            str | None, Field(description="The agent role (default: the configured one).")
        ] = None,
        budget_tokens: Annotated[
            int | None, Field(description="Token budget of the tools' definitions.")
        ] = None,
        max_served: Annotated[int | None, Field(ge=1)] = None,
        project_id: ProjectOverride = None,
        ctx: Context | None = None,
    ) -> CallToolResult:
        """Find the tools of the catalogue that fit a task: each one's name, description and
        input schema (with the tools they require), or an explicit "none fits"."""
        g = self.gateway
        reply = await g.call(
            g.for_call(ctx).search_tools(
                g.project(project_id),
                task,
                role=g.options.role if role is None else role,
                budget_tokens=budget_tokens,
                max_served=max_served,
            )
        )
        data = as_data(reply)
        data["tools"] = [
            {**tool, "input_schema": json.loads(match.input_schema or "{}")}
            for tool, match in zip(data.get("tools", []), reply.tools, strict=True)
        ]
        return answer(tools_text(reply), data)

    # --- resources and prompt -----------------------------------------------------------------

    async def trace_resource(self, trace_id: str, ctx: Context | None = None) -> str:
        """A context call's trace (JSON): every decision and the parts of its score."""
        g = self.gateway
        try:
            reply = await g.for_call(ctx).get_trace(g.project(None), trace_id)
        except (SatchelError, ToolError) as error:
            raise ResourceError(error_text(error, g.options.address)) from None
        return json_format.MessageToJson(reply.trace, preserving_proto_field_name=True)

    async def facts_resource(self, subject_id: str, ctx: Context | None = None) -> str:
        """The active facts of a subject (JSON)."""
        g = self.gateway
        try:
            reply = await g.for_call(ctx).list_facts(g.project(None), subject_id)
        except (SatchelError, ToolError) as error:
            raise ResourceError(error_text(error, g.options.address)) from None
        return json_format.MessageToJson(reply, preserving_proto_field_name=True)

    async def context_for_task(
        self, task: str, subject_id: str = "", ctx: Context | None = None
    ) -> list[UserMessage]:
        """The task, preceded by what satchel remembers that is relevant to it."""
        g = self.gateway
        client = g.for_call(ctx)
        try:
            reply = await client.assemble_context(g.project(None), g.subject(subject_id), task)
        except SatchelError as error:
            raise ValueError(describe(error, g.options.address)) from None
        block = render_packet(reply.packet)
        return [UserMessage(f"{block}\n\n{task}" if block else task)]


def error_text(error: SatchelError | ToolError, address: str) -> str:
    return describe(error, address) if isinstance(error, SatchelError) else str(error)


def trace_text(trace: context_pb2.Trace) -> str:
    """One line per decision: outcome, kind, reason, score parts and the text's start."""
    lines = [
        f"trace {trace.trace_id}: query {trace.query!r}, budget {trace.budget_tokens}, "
        f"{trace.tokens_used} tokens used"
    ]
    for d in trace.decisions:
        outcome = context_pb2.DecisionOutcome.Name(d.outcome).removeprefix("DECISION_OUTCOME_")
        kind = context_pb2.CandidateKind.Name(d.candidate_kind).removeprefix("CANDIDATE_KIND_")
        lines.append(
            f"{d.sequence}. {outcome.lower()} {kind.lower()} {d.candidate_id} "
            f"({d.reason_code}; score {d.score:.3f}, similarity {d.similarity:.3f}, "
            f"text {d.text_rank:.3f}, recency {d.recency:.3f}, {d.tokens} tokens): {d.preview}"
        )
    if trace.empty_reason:
        lines.append(f"empty: {trace.empty_reason}")
    return "\n".join(lines)


def forgotten(deleted: memory_pb2.DeletedCounts) -> str:
    """What a deletion removed, in words."""
    return (
        f"forgot {deleted.events} event(s), {deleted.facts} fact(s), {deleted.conflicts} "
        f"conflict(s) and {deleted.traces} trace(s)"
    )


def facts_text(page: memory_pb2.ListFactsResponse) -> str:
    lines = [
        f"- {fact.id} {fact.predicate} = {json.dumps(as_data(fact).get('value'))}"
        + (f": {fact.statement}" if fact.statement else "")
        for fact in page.facts
    ]
    more = f"\nnext_page_token: {page.next_page_token}" if page.next_page_token else ""
    return ("\n".join(lines) or "no facts") + more


def tools_text(reply: talent_pb2.SearchToolsResponse) -> str:
    if reply.none_fits:
        note = reply.note or "no tool fits this task"
        return note[:1].upper() + note[1:]
    lines = []
    for tool in reply.tools:
        needed = f" (required by {tool.required_by})" if tool.required_by else ""
        lines.append(f"## {tool.name}{needed}\n{tool.description}")
        if tool.input_schema:
            lines.append(f"input schema: {tool.input_schema}")
    return "\n\n".join(lines)


def without_scope(fn: Callable[..., Any], names: frozenset[str]) -> Callable[..., Any]:
    """`fn` with the parameters `names` removed from its signature (a pinned scope)."""
    signature = inspect.signature(fn, eval_str=True)

    @functools.wraps(fn)
    async def tool(**kwargs: Any) -> Any:
        return await fn(**kwargs)

    tool.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[p for p in signature.parameters.values() if p.name not in names]
    )
    tool.__annotations__ = {
        p.name: p.annotation
        for p in tool.__signature__.parameters.values()  # type: ignore[attr-defined]
    } | {"return": signature.return_annotation}
    return tool


TOOL_ANNOTATIONS = {
    "assemble_context": READ,
    "get_trace": READ,
    "list_facts": READ,
    "resolve_talents": READ,
    "record_event": WRITE,
    "assert_fact": WRITE,
    "supersede_fact": WRITE,
    "retire_fact": WRITE,
    "delete_event": DELETE,
    "delete_subject": DELETE,
}


def build_server(options: McpOptions) -> tuple[MCPServer, Gateway]:
    """The MCP server of `options`, and its gateway (close it when the server stops)."""
    gateway = Gateway(options)
    tools = SatchelTools(gateway)
    server = MCPServer("satchel", instructions=INSTRUCTIONS, version=__version__)
    scope = frozenset({"project_id", "subject_id"})
    for name, hints in TOOL_ANNOTATIONS.items():
        fn = getattr(tools, name)
        if options.pinned:
            # delete_subject keeps subject_id: which subject to forget is the call's question.
            fn = without_scope(fn, scope - {"subject_id"} if name == "delete_subject" else scope)
        server.add_tool(fn, name=name, annotations=hints, structured_output=False)
    server.resource("satchel://trace/{trace_id}", mime_type="application/json")(
        tools.trace_resource
    )
    server.resource("satchel://facts/{subject_id}", mime_type="application/json")(
        tools.facts_resource
    )
    server.prompt(name="context_for_task")(tools.context_for_task)
    return server, gateway


class BearerKeyCheck:
    """ASGI middleware of the HTTP transport: a request whose key satchel refuses is 401.

    The key (`Authorization: Bearer KEY`, none if absent) is checked with one cheap call that
    any valid key may make (the first page of the shared talent catalogue); each answer is
    reused for `KEY_CHECK_SECONDS`. Without auth on the satchel server every request passes,
    as every gRPC call would; project isolation stays satchel's (each call carries the key)."""

    def __init__(self, app: Any, gateway: Gateway) -> None:
        self.app = app
        self.gateway = gateway
        self._checked: OrderedDict[str | None, tuple[float, bool]] = OrderedDict()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
            if not await self._accepted(bearer_key(headers)):
                await _unauthorized(send)
                return
        await self.app(scope, receive, send)

    async def _accepted(self, key: str | None) -> bool:
        now = time.monotonic()
        cached = self._checked.get(key)
        if cached is not None and now - cached[0] < KEY_CHECK_SECONDS:
            return cached[1]
        try:
            await self.gateway.client(key).list_talents(page_size=1, timeout=5.0)
            accepted = True
        except SatchelError as error:
            if error.code is not grpc.StatusCode.UNAUTHENTICATED:
                return True  # not the key's fault: the tool call will report it
            accepted = False
        self._checked[key] = (now, accepted)
        self._checked.move_to_end(key)
        while len(self._checked) > 4 * MAX_CALLER_CLIENTS:
            self._checked.popitem(last=False)
        return accepted


async def _unauthorized(send: Any) -> None:
    body = json.dumps(
        {
            "error": "unauthorized",
            "error_description": "satchel refused the API key "
            "(send 'Authorization: Bearer KEY' with a valid satchel key)",
        }
    ).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 401,
            "headers": [
                (b"content-type", b"application/json"),
                (b"www-authenticate", b'Bearer realm="satchel"'),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def serve_stdio(options: McpOptions) -> None:
    """Serve MCP on stdin/stdout until the host closes them."""
    server, gateway = build_server(options)
    try:
        await server.run_stdio_async()
    finally:
        await gateway.close()


async def serve_http(options: McpOptions, host: str, port: int) -> None:
    """Serve MCP over Streamable HTTP at http://HOST:PORT/mcp until interrupted."""
    import uvicorn

    server, gateway = build_server(options)
    app = BearerKeyCheck(server.streamable_http_app(host=host), gateway)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on")
    try:
        await uvicorn.Server(config).serve()
    finally:
        await gateway.close()
