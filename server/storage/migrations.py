"""Schema migrations: the numbered SQL files of `migrations/`, applied with yoyo.

Two servers starting at once on one database are serialised by a PostgreSQL advisory lock
held around yoyo's own bookkeeping (table `_yoyo_migration`).
"""

from __future__ import annotations

import importlib.util
from urllib.parse import quote

import psycopg
import structlog
from psycopg.conninfo import conninfo_to_dict

from satchel.server.config import ConfigError

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


def apply_migrations(dsn: str) -> list[str]:
    """Apply pending migrations (idempotent, safe under concurrency); return the applied ids."""
    from yoyo import get_backend, read_migrations
    from yoyo.migrations import MigrationList

    found = read_migrations(migrations_directory())
    migrations = MigrationList([m for m in found if m.id != "__init__"])
    with psycopg.connect(dsn, autocommit=True) as lock_conn:
        lock_conn.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK_KEY,))
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


def check_embedding_schema(dsn: str, dimension: int, model_id: str) -> None:
    """Refuse to run when the schema's vector size or the stored model differ from the embedder."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT format_type(atttypid, atttypmod) FROM pg_attribute"
            " WHERE attrelid = 'facts'::regclass AND attname = 'embedding'"
        ).fetchone()
        schema_type = row[0] if row else "missing"
        if schema_type != f"vector({dimension})":
            raise ConfigError(
                f"the embedder gives {dimension}-dim vectors but the schema stores {schema_type}:"
                " use a model of the schema's dimension or a new database"
            )
        conn.execute(
            "INSERT INTO satchel_meta (key, value) VALUES ('embedding_model', %s)"
            " ON CONFLICT (key) DO NOTHING",
            (model_id,),
        )
        stored = conn.execute(
            "SELECT value FROM satchel_meta WHERE key = 'embedding_model'"
        ).fetchone()[0]
        if stored != model_id:
            raise ConfigError(
                f"the database holds vectors of {stored!r} but the configured model is"
                f" {model_id!r}: vectors of two models cannot be compared"
            )
