"""Schema migrations: the numbered SQL files of `migrations/`, applied with yoyo.

Two servers starting at once on one database are serialised by a PostgreSQL advisory lock
held around yoyo's own bookkeeping (table `_yoyo_migration`). A file with `-- transactional:
false` runs outside a transaction (CREATE INDEX CONCURRENTLY); squawk lints new files
(`.squawk.toml`, tests/project/test_migrations_lint.py).
"""

from __future__ import annotations

import importlib.util
import secrets
import time
from typing import Any
from urllib.parse import quote

import psycopg
import structlog
from psycopg.conninfo import conninfo_to_dict

from satchel.server.platform.config import ConfigError

log = structlog.get_logger(__name__)

# An arbitrary constant shared by every satchel process: "satchel" in ASCII.
MIGRATION_LOCK_KEY = 0x73617463686C


def _yoyo_uri(dsn: str) -> str:
    """yoyo wants a URI; accept any libpq DSN (URI or key=value) and rebuild one."""
    params = conninfo_to_dict(dsn)
    user = quote(str(params.pop("user", "")), safe="")
    password = params.pop("password", None)
    host = params.pop("host", None)
    port = params.pop("port", None)
    dbname = quote(str(params.pop("dbname", "postgres")), safe="")
    auth = f"{user}:{quote(str(password), safe='')}@" if password else (f"{user}@" if user else "")
    netloc = "" if host is None or str(host).startswith("/") else str(host)
    if netloc and port:
        netloc += f":{port}"
    if host is not None and str(host).startswith("/"):
        params["host"] = host
        if port:
            params["port"] = port
    query = "&".join(f"{k}={quote(str(v), safe='/')}" for k, v in params.items())
    return f"postgresql+psycopg://{auth}{netloc}/{dbname}" + (f"?{query}" if query else "")


def migrations_directory() -> str:
    """Where the numbered SQL files are (the repo's migrations/ or the installed copy)."""
    spec = importlib.util.find_spec("satchel.migrations")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("the migrations directory is missing from this installation")
    return next(iter(spec.submodule_search_locations))


MIN_POSTGRES = 150000  # server_version_num of PostgreSQL 15
MIN_PGVECTOR = (0, 8)  # iterative index scans (hnsw.iterative_scan)


def version_problems(server_version_num: int, pgvector: str | None) -> list[str]:
    """What this PostgreSQL lacks for satchel: its version, and pgvector's (installed, or the
    one CREATE EXTENSION would install); empty when it has everything."""
    problems = []
    if server_version_num < MIN_POSTGRES:
        major, minor = divmod(server_version_num, 10000)
        problems.append(f"PostgreSQL >= 15 is needed, this server runs {major}.{minor}")
    if pgvector is None:
        problems.append("the pgvector extension (>= 0.8) is not available on this server")
    else:
        parts = tuple(int(n) for n in pgvector.split(".")[:2] if n.isdigit())
        if parts < MIN_PGVECTOR:
            problems.append(f"pgvector >= 0.8 is needed (iterative index scans), found {pgvector}")
    return problems


def _one_row(cursor: psycopg.Cursor[tuple[Any, ...]], what: str) -> tuple[Any, ...]:
    """The row of a query that always returns one (RuntimeError naming `what` if none came)."""
    row = cursor.fetchone()
    if row is None:
        raise RuntimeError(f"the query for {what} returned no row")
    return row


def check_database_versions(dsn: str) -> None:
    """Refuse, with what to upgrade, a database server satchel cannot run on."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        version_num = int(
            _one_row(conn.execute("SHOW server_version_num"), "server_version_num")[0]
        )
        row = conn.execute(
            "SELECT coalesce(installed_version, default_version) FROM pg_available_extensions"
            " WHERE name = 'vector'"
        ).fetchone()
    problems = version_problems(version_num, row[0] if row else None)
    if problems:
        raise ConfigError("; ".join(problems))


def apply_migrations(dsn: str) -> list[str]:
    """Apply pending migrations (idempotent, safe under concurrency); return the applied ids.
    A server too old for satchel is refused first (`check_database_versions`)."""
    from yoyo import get_backend, read_migrations

    check_database_versions(dsn)
    from yoyo.migrations import MigrationList

    found = read_migrations(migrations_directory())
    migrations = MigrationList([m for m in found if m.id != "__init__"])
    with psycopg.connect(dsn, autocommit=True) as lock_conn:
        _take_migration_lock(lock_conn)
        try:
            backend = get_backend(_yoyo_uri(dsn))
            try:
                pending = backend.to_apply(migrations)
                with backend.lock():
                    backend.apply_migrations(pending)
            finally:
                backend.connection.close()
        finally:
            lock_conn.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK_KEY,))
    applied = [m.id for m in pending]
    log.info("migrations_applied", applied=applied)
    return applied


def _take_migration_lock(conn: psycopg.Connection) -> None:
    """Take the migration lock by polling, never by waiting in `pg_advisory_lock`.

    A backend blocked in `SELECT pg_advisory_lock` holds a snapshot all the while, and
    CREATE INDEX CONCURRENTLY (a `-- transactional: false` migration, docs/development.md
    "Writing a migration")
    waits for every older snapshot to go: the lock holder's index build would wait for the
    replica waiting for the lock, a deadlock PostgreSQL cannot see (the lock is held on another
    connection). Between two tries a waiting replica holds no snapshot.
    """
    delay = 0.05
    lock = "SELECT pg_try_advisory_lock(%s)"
    while not _one_row(conn.execute(lock, (MIGRATION_LOCK_KEY,)), "pg_try_advisory_lock")[0]:
        time.sleep(delay)
        delay = min(delay * 2, 1.0)


VECTOR_COLUMNS = ("events", "facts", "talent_embeddings")  # each has `embedding vector(N)`


def check_embedding_schema(dsn: str, dimension: int, model_id: str) -> None:
    """Refuse to run when the schema's vector size or the stored model differ from the embedder.

    The migrations create vector(384) columns (the default model's). A database that no model
    has claimed yet and that holds no vector takes the embedder's dimension instead (its
    vector columns are retyped, their indexes rebuilt), so that a 768-dimension model such as
    all-mpnet-base-v2 runs on a new database.
    """
    with psycopg.connect(dsn, autocommit=True) as conn, conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK_KEY,))
        row = conn.execute(
            "SELECT format_type(atttypid, atttypmod) FROM pg_attribute"
            " WHERE attrelid = 'facts'::regclass AND attname = 'embedding'"
        ).fetchone()
        schema_type = row[0] if row else "missing"
        if schema_type != f"vector({dimension})":
            if row is None or not _unclaimed(conn):
                raise ConfigError(
                    f"the embedder gives {dimension}-dim vectors but the schema stores"
                    f" {schema_type}: use a model of the schema's dimension or a new database"
                )
            for table in VECTOR_COLUMNS:
                conn.execute(
                    f"ALTER TABLE {table} ALTER COLUMN embedding TYPE vector({int(dimension)})"
                )
            for table in ("events", "facts"):  # a new type resets the storage (migration 0009)
                conn.execute(f"ALTER TABLE {table} ALTER COLUMN embedding SET STORAGE MAIN")
            log.info("vector_dimension_adopted", dimension=dimension, was=schema_type)
        conn.execute(
            "INSERT INTO satchel_meta (key, value) VALUES ('embedding_model', %s)"
            " ON CONFLICT (key) DO NOTHING",
            (model_id,),
        )
        stored = _one_row(
            conn.execute("SELECT value FROM satchel_meta WHERE key = 'embedding_model'"),
            "satchel_meta's embedding_model",
        )[0]
        if stored != model_id:
            raise ConfigError(
                f"the database holds vectors of {stored!r} but the configured model is"
                f" {model_id!r}: vectors of two models cannot be compared"
            )


def _unclaimed(conn: psycopg.Connection) -> bool:
    """No model has registered on this database and none of its tables holds a vector."""
    held = " OR ".join(f"EXISTS (SELECT 1 FROM {table})" for table in VECTOR_COLUMNS)
    row = _one_row(
        conn.execute(
            "SELECT NOT (EXISTS (SELECT 1 FROM satchel_meta WHERE key = 'embedding_model')"
            f" OR {held})"
        ),
        "whether the database is unclaimed",
    )
    return bool(row[0])


def page_token_secret(dsn: str) -> bytes:
    """The key page tokens are signed with: made once per database, shared by its replicas."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO satchel_meta (key, value) VALUES ('page_token_secret', %s)"
            " ON CONFLICT (key) DO NOTHING",
            (secrets.token_hex(32),),
        )
        row = _one_row(
            conn.execute("SELECT value FROM satchel_meta WHERE key = 'page_token_secret'"),
            "satchel_meta's page_token_secret",
        )
    return bytes.fromhex(row[0])
