"""`satchel keys create|revoke|list`: per-project API keys, straight in the database.

These commands talk to the database (SATCHEL_DATABASE_URL, else the embedded one in
SATCHEL_DATA_DIR), not to a server, so they work whether or not a server runs on that database:
the embedded PostgreSQL is shared by every process using the same data directory, and only the
last process to let go of it stops it. Servers see a new key at once and a revoked one within
SATCHEL_AUTH_CACHE_SECONDS.
"""

from __future__ import annotations

import argparse
import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import psycopg

from satchel.server.platform.auth import SHOWN_PREFIX_CHARS, generate_key, hash_key
from satchel.server.platform.config import ConfigError, Settings

_Command = Callable[[argparse.Namespace, Settings], int]


@contextmanager
def _database(settings: Settings) -> Iterator[psycopg.Connection]:
    """A migrated database connection (autocommit), starting the embedded server if needed."""
    from satchel.server.platform.storage.embedded import EmbeddedPostgres
    from satchel.server.platform.storage.migrations import apply_migrations

    embedded = None
    dsn = settings.database_url
    if not dsn:
        settings.require_embedded_database()
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        embedded = EmbeddedPostgres(settings.data_dir)
        dsn = embedded.start()
    try:
        apply_migrations(dsn)
        with psycopg.connect(
            dsn, autocommit=True, connect_timeout=settings.db_connect_timeout
        ) as conn:
            yield conn
    finally:
        if embedded is not None:
            embedded.stop()


def cmd_keys_create(args: argparse.Namespace, settings: Settings) -> int:
    """Create a key; print what it is, then the key alone on the last line."""
    from satchel.server.platform.api.validation import check_id
    from satchel.server.platform.errors import Violations
    from satchel.server.platform.storage.keys import create_key

    if args.admin == (args.project is not None):
        raise ConfigError("pass either --project P or --admin")
    if args.project is not None:
        violations = Violations()
        check_id(violations, "--project", args.project)
        if violations.items:
            raise ConfigError("; ".join(f"{f} {why}" for f, why in violations.items))
    key = generate_key()
    with _database(settings) as conn:
        row = create_key(
            conn,
            project_id=args.project,
            key_hash=hash_key(key),
            prefix=key[:SHOWN_PREFIX_CHARS],
            name=args.name,
        )
    # Printed once the database is let go of, so that nothing (not even a log line) follows.
    scope = f"project {row.project_id}" if row.project_id else "every project (admin)"
    print(f"created key {row.id} for {scope}; it is shown once, store it now:")
    print(key, flush=True)
    return 0


def cmd_keys_revoke(args: argparse.Namespace, settings: Settings) -> int:
    """Revoke a key by id or by its value; exit 1 when no such key exists."""
    from satchel.server.platform.storage.keys import revoke_key

    if (args.key_id is None) == (args.key is None):
        raise ConfigError("pass either KEY_ID or --key KEY")
    key_id = None
    if args.key_id is not None:
        try:
            key_id = uuid.UUID(args.key_id)
        except ValueError as exc:
            raise ConfigError(f"{args.key_id!r} is not a key id (a UUID)") from exc
    with _database(settings) as conn:
        row = revoke_key(
            conn, key_id=key_id, key_hash=hash_key(args.key) if args.key is not None else None
        )
    if row is None:
        print("no such key", file=sys.stderr)
        return 1
    if row.revoked_at is None:  # revoke_key sets it
        raise RuntimeError(f"key {row.id} came back from revoke_key unrevoked")
    print(f"revoked key {row.id} ({row.prefix}…) at {row.revoked_at.isoformat()}")
    return 0


def cmd_keys_list(args: argparse.Namespace, settings: Settings) -> int:
    """List keys (never their values): id, project, prefix, created, last used, revoked."""
    from satchel.server.platform.storage.keys import list_keys

    with _database(settings) as conn:
        rows = list_keys(conn, args.project)
    for row in rows:
        fields = [
            str(row.id),
            row.project_id or "*admin*",
            row.prefix + "…",
            row.created_at.isoformat(timespec="seconds"),
            "used " + (row.last_used_at.isoformat(timespec="seconds") if row.last_used_at else "-"),
            "revoked " + row.revoked_at.isoformat(timespec="seconds")
            if row.revoked_at
            else "active",
            row.name,
        ]
        print("  ".join(fields).rstrip())
    return 0


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser("keys", help="create, revoke and list API keys")
    keys = parser.add_subparsers(dest="keys_command", required=True)
    create = keys.add_parser("create", help="create a key (printed alone on the last line)")
    create.add_argument("--project", help="the project the key may use")
    create.add_argument("--admin", action="store_true", help="a key for every project")
    create.add_argument("--name", default="", help="a note to recognise the key by")
    create.set_defaults(func=cmd_keys_create)
    revoke = keys.add_parser("revoke", help="revoke a key by id or by value")
    revoke.add_argument("key_id", nargs="?", help="the key's id (from create or list)")
    revoke.add_argument("--key", help="the key itself")
    revoke.set_defaults(func=cmd_keys_revoke)
    listing = keys.add_parser("list", help="list keys (never their values)")
    listing.add_argument("--project", help="only this project's keys")
    listing.set_defaults(func=cmd_keys_list)
