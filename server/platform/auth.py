"""Access control of satchel.v1 calls: API keys, project isolation, concurrent-stream limits.

`AccessInterceptor` sits inside `ServiceInterceptor` (which translates the errors raised here
into google.rpc.Status and logs the call):

- **Authentication** (when `SATCHEL_AUTH` resolves to `required`): every satchel.v1 call carries
  `authorization: Bearer <key>`. A missing, malformed, unknown or revoked key is
  `UNAUTHENTICATED`. Keys are looked up by their SHA-256 through `KeyCache`: a key's answer
  (valid or not) is reused for `SATCHEL_AUTH_CACHE_SECONDS` (default 5 s), so a revocation is
  seen by every replica within that time and a call costs no database round trip for its key.
  Health and reflection are never gated.
- **Authorization**: a project key may only name its own project, in `project_id` and in every
  `requests[i].project_id` of a batch (`PERMISSION_DENIED` otherwise). The global talent
  catalogue is shared: reading it (`ListTalents` without a project) is open to any valid key,
  writing it (`UpsertTalent`) needs an admin key (created without a project). An RPC whose
  request names no project field at all needs an admin key too (fail closed).
- **Database gate**: while the database probe (`satchel.server.platform.probe`) finds PostgreSQL
  down, every satchel.v1 call fails at once with `UNAVAILABLE` / `DATABASE_UNAVAILABLE`.
- **Fair admission** (`satchel.server.platform.admission`): at most `SATCHEL_MAX_ACTIVE_CALLS`
  reads and as many writes run at once (apart: a long batch write never holds a read's slot),
  waiting
  calls are admitted client by client in rotation, and a client may have
  `SATCHEL_MAX_CALLS_PER_CLIENT` calls running or waiting in each (all clients
  `SATCHEL_MAX_CALLS`); one more is `RESOURCE_EXHAUSTED`. WatchTraces lasts, so it is not
  admitted but counted.
- **Stream limits**: at most `SATCHEL_MAX_STREAMS_PER_CLIENT` StreamContext and, apart,
  `SATCHEL_MAX_WATCHES_PER_CLIENT` WatchTraces streams per client; one more is
  `RESOURCE_EXHAUSTED`. A client is its key or, without auth, its connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import secrets
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias, cast

import grpc
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from satchel.server.platform.admission import FairAdmission
from satchel.server.platform.errors import (
    PermissionDenied,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
)

KEY_PREFIX = "satchel_"
"""Every key starts with this; the rest is 32 random bytes, URL-safe base64 (43 characters)."""

SHOWN_PREFIX_CHARS = len(KEY_PREFIX) + 6
"""Characters of a key kept in clear in the database, to recognise it in `satchel keys list`."""

GATED_PREFIX = "/satchel.v1."

ADMIN_ONLY_METHODS = frozenset({"/satchel.v1.TalentService/UpsertTalent"})
"""Writes to the global talent catalogue (shared by every project)."""

_MAX_KEY_CHARS = 256


def generate_key() -> str:
    """A new API key (shown once; only its hash is stored)."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def hash_key(key: str) -> bytes:
    """The SHA-256 stored for a key."""
    return hashlib.sha256(key.encode()).digest()


@dataclass(frozen=True)
class Principal:
    """Who is calling: a key of one project, or an admin key (`project_id` None)."""

    key_id: str
    project_id: str | None

    @property
    def is_admin(self) -> bool:
        return self.project_id is None

    def may_access(self, project_id: str) -> bool:
        return self.project_id is None or self.project_id == project_id


KeyLookup = Callable[[bytes], Awaitable[Principal | None]]


class KeyCache:
    """Answers "whose key is this?" from memory for `ttl` seconds after each database lookup.

    Unknown keys are cached too (a client retrying a bad key costs nothing), apart from the
    known ones: each side holds at most `max_entries` keys, so that a flood of random keys
    never evicts the keys in use. Concurrent misses of one key share a single lookup.
    """

    def __init__(
        self,
        lookup: KeyLookup,
        ttl: float,
        *,
        max_entries: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._lookup = lookup
        self.ttl = ttl
        self._max_entries = max_entries
        self._clock = clock
        self._entries: dict[bytes, tuple[float, Principal | None]] = {}
        self._unknown: dict[bytes, tuple[float, Principal | None]] = {}
        self._pending: dict[bytes, asyncio.Task[Principal | None]] = {}
        self.lookups = 0
        """Database lookups made so far (for tests and metrics)."""

    async def get(self, key_hash: bytes) -> Principal | None:
        """The key's principal (None: unknown or revoked), from memory when fresh enough."""
        entry = self._entries.get(key_hash) or self._unknown.get(key_hash)
        if entry is not None and entry[0] > self._clock():
            return entry[1]
        task = self._pending.get(key_hash)
        if task is None:
            task = asyncio.ensure_future(self._load(key_hash))
            self._pending[key_hash] = task
            task.add_done_callback(lambda done: self._done(key_hash, done))
        # A caller that goes away does not cancel the lookup other callers may share.
        return await asyncio.shield(task)

    async def _load(self, key_hash: bytes) -> Principal | None:
        self.lookups += 1
        principal = await self._lookup(key_hash)
        if self.ttl > 0:
            self._store(key_hash, principal)
        return principal

    def _done(self, key_hash: bytes, task: asyncio.Task[Principal | None]) -> None:
        if self._pending.get(key_hash) is task:
            del self._pending[key_hash]
        if not task.cancelled():
            task.exception()  # retrieved here: callers (if any) re-raise it themselves

    def _store(self, key_hash: bytes, principal: Principal | None) -> None:
        now = self._clock()
        side = self._entries if principal is not None else self._unknown
        (self._unknown if principal is not None else self._entries).pop(key_hash, None)
        if len(side) >= self._max_entries:
            for stale in [k for k, v in side.items() if v[0] <= now]:
                del side[stale]
            while len(side) >= self._max_entries:  # evict the oldest entries
                del side[next(iter(side))]
        side[key_hash] = (now + self.ttl, principal)


def bearer_key(metadata: Sequence[tuple[str, str | bytes]] | None) -> str:
    """The key of an `authorization: Bearer <key>` header; raises UNAUTHENTICATED otherwise."""
    values = [v for k, v in metadata or () if k.lower() == "authorization"]
    if not values:
        raise Unauthenticated(
            "this server needs an API key: send `authorization: Bearer <key>`",
            reason="MISSING_API_KEY",
        )
    value = values[0]
    if isinstance(value, bytes):
        value = value.decode("latin-1")
    scheme, _, key = value.strip().partition(" ")
    key = key.strip()
    if len(values) > 1 or scheme.lower() != "bearer" or not key or len(key) > _MAX_KEY_CHARS:
        raise Unauthenticated(
            "the authorization header must be a single `Bearer <key>`", reason="INVALID_API_KEY"
        )
    return key


def request_projects(request: Any) -> tuple[bool, set[str]]:
    """(whether the request has a project field, the non-empty project ids it names).

    Looks at `project_id` and at the `project_id` of every item of a repeated message field
    (the `requests` of batch RPCs).
    """
    if not isinstance(request, Message):
        return False, set()
    scoped = False
    projects: set[str] = set()
    for field in request.DESCRIPTOR.fields:
        if field.name == "project_id" and field.type == FieldDescriptor.TYPE_STRING:
            scoped = True
            project_id: str = getattr(request, field.name)  # the descriptor's project_id
            if project_id:
                projects.add(project_id)
        elif (
            field.is_repeated
            and field.message_type is not None
            and "project_id" in field.message_type.fields_by_name
        ):
            scoped = True
            projects.update(i.project_id for i in getattr(request, field.name) if i.project_id)
    return scoped, projects


def authorize(method: str, principal: Principal, request: Any) -> None:
    """Raise PERMISSION_DENIED unless `principal` may make this call."""
    if principal.is_admin:
        return
    scoped, projects = request_projects(request)
    if method in ADMIN_ONLY_METHODS or not scoped:
        raise PermissionDenied(
            "this call changes what every project shares: it needs an admin key",
            reason="ADMIN_KEY_REQUIRED",
        )
    for project in sorted(projects):
        if not principal.may_access(project):
            raise PermissionDenied(
                "this API key belongs to another project",
                reason="PROJECT_NOT_ALLOWED",
                metadata={"project_id": project[:200]},
            )


class StreamSlots:
    """Counts the server streams (of one kind) each client has open."""

    def __init__(self, limit: int, what: str = "streams") -> None:
        self.limit = limit
        self.what = what
        self._open: dict[str, int] = {}

    def acquire(self, client: str) -> None:
        count = self._open.get(client, 0)
        if count >= self.limit:
            raise ResourceExhausted(
                f"this client already has {count} {self.what} open (the limit is {self.limit})",
                reason=f"TOO_MANY_{self.what.upper()}",
                metadata={"limit": str(self.limit)},
            )
        self._open[client] = count + 1

    def release(self, client: str) -> None:
        count = self._open.get(client, 1) - 1
        if count > 0:
            self._open[client] = count
        else:
            self._open.pop(client, None)


WATCH_METHOD = "/satchel.v1.ContextService/WatchTraces"

WRITE_PREFIXES = (
    "Record",
    "Batch",
    "Assert",
    "Retire",
    "Supersede",
    "Open",
    "Resolve",
    "Upsert",
    "Set",
    "Delete",
)
"""Method names of writes: admitted apart from reads, so that a long batch write (its texts are
embedded first) never holds the slot of the context calls. ResolveTalents is a read."""

# grpc.aio's behaviours, which grpc-stubs' RpcMethodHandler types as synchronous ones.
_AsyncUnary: TypeAlias = Callable[[Any, "grpc.aio.ServicerContext[Any, Any]"], Awaitable[Any]]
_AsyncStream: TypeAlias = Callable[
    [Any, "grpc.aio.ServicerContext[Any, Any]"], AsyncGenerator[Any, None]
]


class AccessInterceptor(grpc.aio.ServerInterceptor):
    """Gates on the database, authenticates, authorizes, admits (fairly) and limits the streams
    of every satchel.v1 call.

    `keys` is None when auth is disabled (a client is then its connection, else its key).
    `database_up` is the probe's verdict; calls are refused at once while it is False.
    `admission` takes every call but WatchTraces, which lasts: watches and context streams are
    counted apart (`watches`, `streams`), so that watches never use up other streams' room.
    """

    def __init__(
        self,
        *,
        keys: KeyCache | None,
        max_streams_per_client: int,
        max_watches_per_client: int,
        admission: FairAdmission,
        write_admission: FairAdmission,
        database_up: Callable[[], bool] = lambda: True,
    ) -> None:
        self._keys = keys
        self._database_up = database_up
        self.streams = StreamSlots(max_streams_per_client)
        self.watches = StreamSlots(max_watches_per_client, what="watches")
        self.admission = admission
        self.write_admission = write_admission

    def _admission_of(self, method: str) -> FairAdmission:
        name = method.rsplit("/", 1)[-1]
        if name.startswith(WRITE_PREFIXES) and name != "ResolveTalents":
            return self.write_admission
        return self.admission

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]
        ],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(details)
        method: str = details.method
        if handler is None or not method.startswith(GATED_PREFIX):
            return handler
        if not self._database_up():
            return _refusing(
                handler,
                Unavailable(
                    "the database is unavailable, retry later", reason="DATABASE_UNAVAILABLE"
                ),
            )
        principal: Principal | None = None
        key_hash = b""
        if self._keys is not None:
            try:
                key_hash = hash_key(bearer_key(details.invocation_metadata))
                principal = await self._keys.get(key_hash)
                if principal is None:
                    raise Unauthenticated(
                        "the API key is unknown or revoked", reason="INVALID_API_KEY"
                    )
            except Exception as exc:  # ServiceInterceptor translates it
                return _refusing(handler, exc)
        return self._wrap(handler, method, principal, key_hash)

    async def _while_valid(
        self, messages: AsyncGenerator[Any, None], key_hash: bytes
    ) -> AsyncGenerator[Any, None]:
        """`messages`, ended with UNAUTHENTICATED once the key is revoked: it is checked again
        each cache time (SATCHEL_AUTH_CACHE_SECONDS) while the stream lasts, waiting or not."""
        assert self._keys is not None
        period = max(self._keys.ttl, 0.1)
        pending: asyncio.Future[Any] | None = None
        try:
            while True:
                if pending is None:
                    pending = asyncio.ensure_future(anext(messages))
                done, _ = await asyncio.wait({pending}, timeout=period)
                if pending in done:
                    try:
                        message = pending.result()
                    except StopAsyncIteration:
                        return
                    pending = None
                    yield message
                if await self._keys.get(key_hash) is None:
                    raise Unauthenticated("the API key was revoked", reason="INVALID_API_KEY")
        finally:
            if pending is not None:  # the next message was being made: stop that first
                pending.cancel()
                with contextlib.suppress(BaseException):
                    await pending
            await messages.aclose()

    def _wrap(
        self,
        handler: grpc.RpcMethodHandler[Any, Any],
        method: str,
        principal: Principal | None,
        key_hash: bytes,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        if handler.request_streaming:
            # Requests cannot be inspected before the call starts: admin keys only.
            if principal is not None and not principal.is_admin:
                return _refusing(
                    handler, PermissionDenied("needs an admin key", reason="ADMIN_KEY_REQUIRED")
                )
            return handler
        inner = handler.unary_unary or handler.unary_stream
        assert inner is not None

        def client_of(context: grpc.aio.ServicerContext[Any, Any]) -> str:
            return f"key:{principal.key_id}" if principal else f"peer:{context.peer()}"

        admission = self._admission_of(method)

        if handler.unary_unary is not None:
            unary_inner = cast(_AsyncUnary, inner)  # grpc-stubs type handlers as sync

            async def unary(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
                if principal is not None:
                    authorize(method, principal, request)
                async with admission.slot(client_of(context)):
                    return await unary_inner(request, context)

            return grpc.unary_unary_rpc_method_handler(
                unary,
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )

        stream_inner = cast(_AsyncStream, inner)  # grpc-stubs type handlers as sync

        async def stream(
            request: Any, context: grpc.aio.ServicerContext[Any, Any]
        ) -> AsyncIterator[Any]:
            if principal is not None:
                authorize(method, principal, request)
            client = client_of(context)
            slots = self.watches if method == WATCH_METHOD else self.streams
            slots.acquire(client)
            try:
                messages = stream_inner(request, context)
                if principal is not None and method == WATCH_METHOD:  # the stream that lasts
                    messages = self._while_valid(messages, key_hash)
                if method == WATCH_METHOD:
                    async for message in messages:
                        yield message
                else:
                    async with admission.slot(client):
                        async for message in messages:
                            yield message
            finally:
                slots.release(client)

        return grpc.unary_stream_rpc_method_handler(
            stream,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )


def _refusing(
    handler: grpc.RpcMethodHandler[Any, Any], error: BaseException
) -> grpc.RpcMethodHandler[Any, Any]:
    """A handler of the same shape that ignores the request and raises `error`."""

    def ignore(data: bytes) -> None:
        return None

    async def unary(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        raise error

    async def stream(
        request: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[Any]:
        raise error
        yield  # type: ignore[unreachable]  # pragma: no cover - makes this an async generator

    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(
            stream, response_serializer=handler.response_serializer
        )
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(
            unary, response_serializer=handler.response_serializer
        )
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(
            stream, request_deserializer=ignore, response_serializer=handler.response_serializer
        )
    return grpc.unary_unary_rpc_method_handler(
        unary, request_deserializer=ignore, response_serializer=handler.response_serializer
    )
