"""What the services share: settings, the connection pool and the embedder."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

import numpy as np
from psycopg_pool import AsyncConnectionPool

from satchel.server.context.scope_cache import ScopeCache
from satchel.server.embedding.port import Embedder
from satchel.server.embedding.spans import part_spans
from satchel.server.platform.config import Settings
from satchel.server.platform.reads import ReadRouter, ReadTarget
from satchel.server.platform.telemetry import Telemetry
from satchel.server.platform.tokens import TokenCounter, counter_of

if TYPE_CHECKING:
    from satchel.server.context.watch import TraceHub

T = TypeVar("T")

QUERY_ON_LOOP_MAX_CHARS = 256
"""The longest query embedded on the event loop itself (`Runtime.embed_query`)."""


@dataclass
class Runtime:
    """The dependencies of the gRPC services, ready once the database and model are."""

    settings: Settings
    pool: AsyncConnectionPool
    embedder: Embedder
    # Connections that run generic plans (`create_pool(planned=True)`), for the context
    # statements that do (plan, facts, episodes, multi-hop); None: `pool` serves them too.
    planned_pool: AsyncConnectionPool | None = None
    # ONNX releases the GIL; one thread keeps the model's long runs (stored texts, long
    # queries) off the event loop without competing with PostgreSQL for the machine's cores.
    executor: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(max_workers=1, thread_name_prefix="embed")
    )
    # Metrics and spans (no-op unless SATCHEL_METRICS_LISTEN / SATCHEL_OTEL enable them).
    telemetry: Telemetry = field(default_factory=Telemetry)
    # WatchTraces' listener and local watchers (None where nothing is watched, e.g. tools).
    traces: TraceHub | None = None
    # What page tokens are signed with (the deployment's, `page_token_secret`).
    page_secret: bytes = b""
    # Where reads go (the primary alone unless SATCHEL_DATABASE_READ_URLS names replicas).
    reads: ReadRouter = field(init=False)
    replicas: list[ReadTarget] = field(default_factory=list)
    # The events and facts of the scopes read most, for hybrid ranking in memory.
    scope_cache: ScopeCache = field(init=False)
    # What counts a context block's tokens (SATCHEL_TOKENIZER, else characters / 4).
    tokens: TokenCounter = field(init=False)

    def __post_init__(self) -> None:
        primary = ReadTarget("primary", self.pool, self.context_pool)
        wait = self.settings.read_replica_max_wait_seconds
        self.reads = ReadRouter(primary, self.replicas, max_wait=wait)
        self.tokens = counter_of(self.settings)
        context = self.settings.context
        self.scope_cache = ScopeCache(
            self.pool,
            context.scope_cache_mb * 2**20,
            context.scope_cache_max_rows,
            context.scope_cache_load_share,
            context.scope_cache_vectors,
        )
        if self.traces is not None:  # deletions this server hears of (other servers' too)
            self.traces.on_erasure(self.scope_cache.forget)
            # watched packets are rendered as the calls rendered them
            self.traces.render_like(self.tokens, context)

    def forget_scope(self, project_id: str, subject_id: str | None) -> None:
        """Drop what this server holds in memory of a scope whose rows it just deleted (of
        every scope of the project when `subject_id` is None); the other servers hear of it
        from the database (`TraceHub.on_erasure`)."""
        self.scope_cache.forget(project_id, subject_id)
        if self.traces is not None:
            self.traces.forget(project_id, subject_id)

    @property
    def context_pool(self) -> AsyncConnectionPool:
        """The pool of the context statements that run generic plans."""
        return self.planned_pool or self.pool

    @property
    def pools(self) -> dict[str, AsyncConnectionPool]:
        """Every pool by name ("main", and "planned" when there is one)."""
        named = {"main": self.pool, "planned": self.planned_pool}
        return {name: pool for name, pool in named.items() if pool is not None}

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Embed texts off the event loop."""
        batch = list(texts)
        loop = asyncio.get_running_loop()
        with self.telemetry.span("satchel.embed", {"satchel.texts": len(batch)}):
            return await loop.run_in_executor(self.executor, self._embed_timed, batch)

    def _embed_timed(self, texts: list[str]) -> np.ndarray:
        started = time.perf_counter()
        vectors = self.embedder.embed(texts)
        self.telemetry.observe_embedding(time.perf_counter() - started, len(texts))
        return vectors

    async def embed_query(self, text: str) -> np.ndarray:
        """Embed one query (with the model's query prefix): a short one on the event loop, a
        long one in the executor.

        Handing a query to the executor costs two thread wake-ups (there and back), 0.4-0.9 ms
        a call on a 2-core VM: as much as half the embedding. A short query is embedded on the
        loop instead, once the tasks already scheduled have run, so that a statement started
        before it (a context call's plan) is on its way and runs in PostgreSQL meanwhile; the
        loop is held no longer than such a query takes (~5 ms at `QUERY_ON_LOOP_MAX_CHARS`).
        """
        text = self.embedder.query_prefix + text
        vector: np.ndarray = (await self._run_query(text, lambda: self.embedder.embed([text])))[0]
        return vector

    async def embed_query_parts(
        self, text: str, parts: Sequence[str]
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """A query's vector (as `embed_query`) and, pooled from the same model run, one per part
        of it (`parts`: substrings of `text`, in order); None for the parts when there are none
        or the embedder cannot pool them (`port.SpanPooler`)."""
        pool = getattr(self.embedder, "embed_with_spans", None)
        prefixed = self.embedder.query_prefix + text
        spans = part_spans(text, parts, offset=len(self.embedder.query_prefix))
        result = None
        if pool is not None and spans:
            result = await self._run_query(prefixed, lambda: pool(prefixed, spans))
        if result is None:
            return await self.embed_query(text), None
        whole, pooled = result
        return whole, pooled

    async def _run_query(self, prefixed: str, run: Callable[[], T]) -> T:
        """`run()`, one model run over a query (`prefixed`, prompt included), timed: on the
        event loop for a short query, in the executor for a long one (`embed_query`)."""

        def timed() -> T:
            started = time.perf_counter()
            result = run()
            self.telemetry.observe_embedding(time.perf_counter() - started, 1)
            return result

        with self.telemetry.span("satchel.embed", {"satchel.texts": 1}):
            if len(prefixed) > QUERY_ON_LOOP_MAX_CHARS:
                return await asyncio.get_running_loop().run_in_executor(self.executor, timed)
            await asyncio.sleep(0)
            return timed()

    async def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        """Embed stored texts (with the model's passage prefix)."""
        prefix = self.embedder.passage_prefix
        return await self.embed([prefix + text for text in texts])


class RuntimeRef:
    """A slot the services read the runtime from; empty while the server starts."""

    def __init__(self) -> None:
        self.value: Runtime | None = None

    def __call__(self) -> Runtime:
        if self.value is None:
            from satchel.server.platform.errors import Unavailable

            raise Unavailable("satchel is starting", reason="NOT_READY")
        return self.value
