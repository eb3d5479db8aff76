"""Shared fixtures: one real PostgreSQL (embedded, or SATCHEL_TEST_DATABASE_URL), the real
embedding model, and a real satchel server on a loopback port.

Tests isolate themselves by using a fresh project id, so nothing is cleaned between them. They
live by use case (context/, memory/, talents/, platform/, …, as server/ is laid out); what
they share is in helpers/ (`from helpers.servers import running`), and a test module may reuse
another's scenario by its name (`from test_context import assemble`): every folder is on the
path, whatever pytest collects first.
"""

from __future__ import annotations

import os
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path

import grpc
import pytest

from satchel.server.platform.config import Settings

TEST_ROOT = Path(os.environ.get("SATCHEL_TEST_DIR", "/var/tmp/satchel-tests"))
sys.path[:0] = sorted(
    str(folder)
    for folder in Path(__file__).parent.iterdir()
    if folder.is_dir() and folder.name not in ("helpers", "__pycache__")
)


@pytest.fixture(scope="session")
def test_root() -> Path:
    TEST_ROOT.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix="run-", dir=TEST_ROOT))


@pytest.fixture(scope="session")
def pg_dsn(test_root: Path) -> Iterator[str]:
    """A migrated PostgreSQL with pgvector for the whole session."""
    from satchel.server.platform.storage.embedded import start_pgserver
    from satchel.server.platform.storage.migrations import apply_migrations

    external = os.environ.get("SATCHEL_TEST_DATABASE_URL")
    if external:
        apply_migrations(external)
        yield external
        return
    server = start_pgserver(test_root / "pg", cleanup_mode="delete")
    dsn = server.get_uri()
    apply_migrations(dsn)
    yield dsn
    server.cleanup()


@pytest.fixture(scope="session")
def embedder(test_root: Path):
    """The real default model (all-MiniLM-L6-v2 int8), loaded from installed packages."""
    from satchel.server.embedding.fastembed_adapter import FastEmbedEmbedder

    return FastEmbedEmbedder(cache_dir=test_root / "cache")


@pytest.fixture(scope="session")
def settings(pg_dsn: str, test_root: Path) -> Settings:
    base = Settings.from_env({})
    # Scope index maintenance would index the scopes of every test that lowers the exact cut,
    # in the shared database: here it builds nothing; it is tested on databases of its own
    # (test_scope_indexes.py).
    return replace(
        base,
        database_url=pg_dsn,
        data_dir=test_root / "data",
        listen="127.0.0.1:0",
        scope_index_max=0,
    )


@pytest.fixture(scope="session")
async def server(settings: Settings) -> AsyncIterator:
    """A real satchel server in this process, on a free loopback port."""
    from satchel.server.platform.app import SatchelServer

    srv = SatchelServer(settings)
    await srv.start()
    yield srv
    await srv.stop()


@pytest.fixture(scope="session")
def address(server) -> str:
    return f"127.0.0.1:{server.port}"


@pytest.fixture
async def channel(address: str) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(address) as chan:
        yield chan


@pytest.fixture(scope="session")
async def seed_server(settings: Settings) -> AsyncIterator:
    """A second server on the same database behaving as the seed does: its ranking
    (SATCHEL_RANKING=seed) and its budget, the served texts' estimates
    (SATCHEL_BUDGET_COUNTS=items)."""
    from satchel.server.platform.app import SatchelServer

    seed = replace(settings.context.with_ranking("seed"), budget_counts="items")
    srv = SatchelServer(replace(settings, context=seed))
    await srv.start()
    yield srv
    await srv.stop()


@pytest.fixture
async def seed_channel(seed_server) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{seed_server.port}") as chan:
        yield chan


@pytest.fixture
def project_id() -> str:
    """A fresh project per test: tests never see each other's rows."""
    return f"test-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def start_server(settings: Settings):
    """Start extra servers on the same database with other context settings; stopped after."""
    from contextlib import asynccontextmanager

    from satchel.server.platform.app import SatchelServer

    @asynccontextmanager
    async def start(**context_overrides):
        context = replace(settings.context, **context_overrides)
        srv = SatchelServer(replace(settings, context=context))
        await srv.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{srv.port}") as chan:
                yield chan
        finally:
            await srv.stop()

    return start


@pytest.fixture
def fresh_database(pg_dsn: str) -> Iterator[str]:
    """An empty database on the session's server, dropped afterwards."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    name = f"fresh_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    params = conninfo_to_dict(pg_dsn)
    params["dbname"] = name
    yield make_conninfo(**params)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
