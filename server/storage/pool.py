"""The async connection pool and the settings every pooled connection needs."""

from __future__ import annotations

from pgvector.psycopg import register_vector_async
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool


def create_pool(dsn: str, *, min_size: int, max_size: int, ef_search: int) -> AsyncConnectionPool:
    """A pool whose connections know the vector type and search HNSW deeply enough.

    `hnsw.ef_search` defaults to 40, which caps an HNSW LIMIT 64 at 40 rows; with a scope
    filter, only an iterative scan returns the rows asked for (pgvector >= 0.8).
    """

    async def configure(conn: AsyncConnection) -> None:
        await register_vector_async(conn)
        await conn.execute(f"SET hnsw.ef_search = {int(ef_search)}")
        await conn.execute("SET hnsw.iterative_scan = relaxed_order")
        await conn.commit()

    return AsyncConnectionPool(
        dsn,
        min_size=min_size,
        max_size=max_size,
        configure=configure,
        open=False,
        name="satchel",
    )
