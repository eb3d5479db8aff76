"""The async connection pool and the settings every pooled connection needs."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from weakref import WeakSet

import orjson
from pgvector.psycopg import register_vector_async
from psycopg import AsyncConnection
from psycopg.pq import TransactionStatus
from psycopg.types.json import set_json_loads
from psycopg_pool import AsyncConnectionPool


def create_pool(
    dsn: str,
    *,
    min_size: int,
    max_size: int,
    ef_search: int,
    timeout: float = 5.0,
    connect_timeout: int = 5,
    statement_timeout: float = 0.0,
    planned: bool = False,
) -> AsyncConnectionPool:
    """A pool whose connections know the vector type and search HNSW deeply enough.

    `planned`: its connections run the generic plans of their prepared statements, made without
    sequential scans, for the whole session (see `generic_plans`), which then costs nothing; they
    are in autocommit mode (single statements, or `conn.transaction()` blocks).

    `hnsw.ef_search` defaults to 40, which caps an HNSW LIMIT 64 at 40 rows; with a scope
    filter, only an iterative scan returns the rows asked for (pgvector >= 0.8).

    Faults: a call waits at most `timeout` seconds for a connection (then `PoolTimeout`, which
    the interceptor turns into UNAVAILABLE), a connection attempt gives up after
    `connect_timeout` seconds, TCP keepalives notice a vanished server within about a minute,
    and `statement_timeout` (seconds, 0: none) bounds any statement, so that no call holds a
    pooled connection forever, whatever its client does.
    """

    async def configure(conn: AsyncConnection) -> None:
        await register_vector_async(conn)
        await conn.execute(f"SET hnsw.ef_search = {int(ef_search)}")
        await conn.execute("SET hnsw.iterative_scan = relaxed_order")
        await conn.execute(f"SET statement_timeout = {int(statement_timeout * 1000)}")
        if planned:
            for name, value in _GENERIC_PLAN_SETTINGS:
                await conn.execute(f"SET {name} = {value}")
            _PLANNED.add(conn)
            # The facts' values, read by every context call: ~5x faster than json.loads. (An
            # integer beyond 64 bits reads as a float, as it is served: Value holds doubles.)
            set_json_loads(orjson.loads, conn)
        await conn.commit()
        if planned:
            await conn.set_autocommit(True)

    return AsyncConnectionPool(
        dsn,
        min_size=min_size,
        max_size=max_size,
        configure=configure,
        open=False,
        name="satchel-planned" if planned else "satchel",
        timeout=timeout,
        kwargs={
            "connect_timeout": connect_timeout,
            "keepalives": 1,
            "keepalives_idle": 30,
            "keepalives_interval": 10,
            "keepalives_count": 3,
        },
    )


@asynccontextmanager
async def autocommit(pool: AsyncConnectionPool) -> AsyncIterator[AsyncConnection]:
    """A pooled connection in autocommit mode, for work made of single statements.

    Outside autocommit, psycopg opens each transaction with a BEGIN of its own and the pool's
    context closes it with a COMMIT: two round trips more per statement. Each statement here is
    its own transaction; `conn.transaction()` still groups several.
    """
    async with pool.connection() as conn:
        switched = not conn.autocommit  # a planned pool's connections are in autocommit already
        if switched:
            await conn.set_autocommit(True)
        try:
            yield conn
        finally:
            if conn.info.transaction_status != TransactionStatus.IDLE:
                await conn.close()  # lost or cut short: resetting it would raise over the error
            elif switched:
                await conn.set_autocommit(False)


_GENERIC_PLAN_SETTINGS = (("plan_cache_mode", "force_generic_plan"), ("enable_seqscan", "off"))
_PER_CALL_PLAN_SETTINGS = (("plan_cache_mode", "force_custom_plan"), ("enable_seqscan", "on"))
# The connections of planned pools (they hold _GENERIC_PLAN_SETTINGS for their session).
_PLANNED: WeakSet[AsyncConnection] = WeakSet()


@asynccontextmanager
async def _transaction_with(
    conn: AsyncConnection, settings: tuple[tuple[str, str], ...]
) -> AsyncIterator[None]:
    """A pipelined transaction (one round trip with its statement) that holds `settings`."""
    calls = (f"set_config('{name}', '{value}', true)" for name, value in settings)
    async with conn.pipeline(), conn.transaction():
        await conn.execute("SELECT " + ", ".join(calls))
        yield


@asynccontextmanager
async def generic_plans(conn: AsyncConnection) -> AsyncIterator[None]:
    """Prepared statements run their generic plan, made without sequential scans: for the
    facts (exact or two-phase, as the scope's size chose), hybrid episodes and multi-hop
    (scopes scored exactly) of one scope.

    PostgreSQL plans a prepared statement for each call's values until the generic plan looks
    no costlier; for the exact facts statement it never did, 2 to 4 ms of planning every call.
    A generic plan is made without the scope's values: where a few scopes hold most of the
    table it expected a scope to be large and read the whole table (61 ms instead of 3 for a
    300-fact scope beside a 100,000-fact one, benchmarks/context.md). Without sequential scans
    it reads the scope through its indexes, right for any scope a path was chosen for.

    A connection of a planned pool holds these settings already: nothing to do. Any other
    opens a pipelined transaction that sets them for the statement (~0.9 ms of the event loop
    and a round trip's worth of statements more).
    """
    if conn in _PLANNED:
        yield
        return
    async with _transaction_with(conn, _GENERIC_PLAN_SETTINGS):
        yield


@asynccontextmanager
async def per_call_plans(conn: AsyncConnection) -> AsyncIterator[None]:
    """A transaction whose prepared statements are planned for each call's values, sequential
    scans allowed: for the statements whose generic plan would not suit every scope (the
    multi-hop of a scope too large to score exactly: a 100,000-fact scope's call 40 → 60 ms;
    the seed's HNSW episodes).

    Forced, on any connection: a statement also run under `generic_plans` keeps that generic
    plan cached, and PostgreSQL's own choice (`auto`) may reuse it here once it looks cheaper
    than the custom plans made so far.
    """
    async with _transaction_with(conn, _PER_CALL_PLAN_SETTINGS):
        yield
