"""Migrations production can run without locking: squawk (PyPI squawk-cli) lints migrations/.

The released files (already applied everywhere) are excluded in `.squawk.toml`; every new one
is linted, transactional files as yoyo runs them (in a transaction) and `-- transactional:
false` files outside one. A scratch migration that builds an index without CONCURRENTLY or
rewrites a table fails; a CONCURRENTLY one in a non-transactional file passes and yoyo applies it.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import threading
import time
import tomllib
from pathlib import Path

import psycopg
import pytest
from helpers.paths import ROOT
from yoyo.migrations import parse_metadata_from_sql_comments

SQUAWK = str(Path(sys.executable).parent / "squawk")
CONFIG = ROOT / ".squawk.toml"
LAST_RELEASED = 11  # migrations up to this number are excluded from the lint (released)
LAST = sorted((ROOT / "migrations").glob("*.sql"))[-1].stem
HEAD = f"-- depends: {LAST}\n"
NEXT = f"{int(LAST[:4]) + 1:04d}"  # a scratch migration's number, after the last real one
# The recipe of docs/development.md ("Writing a migration"): a failed concurrent build leaves
# an INVALID index behind, dropped on retry.
CONCURRENT = (
    "SET lock_timeout = '5s';\n"
    "DROP INDEX CONCURRENTLY IF EXISTS facts_subject_scratch;\n"
    "CREATE INDEX CONCURRENTLY facts_subject_scratch ON facts (subject_id);\n"
)


def transactional(path: Path) -> bool:
    """Whether yoyo runs the file in a transaction (its own directive parser)."""
    directives, _, _ = parse_metadata_from_sql_comments(path.read_text())
    return directives.get("transactional", "true").lower() != "false"


def lint(paths: list[Path]) -> list[tuple[str, str]]:
    """squawk's findings over `paths` as (file name, rule), with the repository's config."""
    found = []
    for in_transaction in (True, False):
        group = [str(p) for p in paths if transactional(p) == in_transaction]
        if not group:
            continue
        result = subprocess.run(
            [
                SQUAWK,
                "--config",
                str(CONFIG),
                "--reporter",
                "gitlab",
                "--no-error-on-unmatched-pattern",
                *([] if in_transaction else ["--no-assume-in-transaction"]),
                *group,
            ],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=60,
        )
        issues = json.loads(result.stdout or "[]")
        assert (result.returncode != 0) == bool(issues), result.stderr
        found += [(Path(i["location"]["path"]).name, i["check_name"]) for i in issues]
    return found


def scratch(directory: Path, name: str, sql: str) -> Path:
    path = directory / name
    path.write_text(sql)
    return path


def test_the_migrations_pass_squawk() -> None:
    migrations = sorted((ROOT / "migrations").glob("*.sql"))
    assert lint(migrations) == []
    excluded = tomllib.loads(CONFIG.read_text())["excluded_paths"]
    names = {p.name for p in migrations}
    for pattern in excluded:  # each names one released file (a new file is never excluded)
        name = pattern.removeprefix("*")
        assert name in names and int(name[:4]) <= LAST_RELEASED, pattern


@pytest.mark.parametrize(
    ("sql", "rule"),
    [
        ("CREATE INDEX facts_subject ON facts (subject_id);", "require-concurrent-index-creation"),
        (
            "ALTER TABLE facts ALTER COLUMN statement TYPE varchar(100);",  # rewrites the table
            "changing-column-type",
        ),
        (
            "ALTER TABLE events ADD COLUMN n integer NOT NULL DEFAULT (random() * 10)::int;",
            "adding-field-with-default",  # a volatile default rewrites the table
        ),
        ("DROP INDEX facts_scope_recency;", "require-concurrent-index-deletion"),
    ],
)
def test_a_new_migration_that_locks_a_table_fails(tmp_path: Path, sql: str, rule: str) -> None:
    bad = scratch(tmp_path, f"{NEXT}_scratch.sql", f"{HEAD}SET lock_timeout = '5s';\n{sql}\n")
    assert rule in {r for _, r in lint([bad])}


def test_a_new_migration_without_lock_timeout_fails(tmp_path: Path) -> None:
    bad = scratch(
        tmp_path, f"{NEXT}_scratch.sql", f"{HEAD}ALTER TABLE talents ADD COLUMN x text;\n"
    )
    assert lint([bad]) == [(f"{NEXT}_scratch.sql", "require-lock-timeout")]


def test_a_concurrent_index_goes_in_a_non_transactional_file(tmp_path: Path) -> None:
    good = scratch(tmp_path, f"{NEXT}_good.sql", f"{HEAD}-- transactional: false\n{CONCURRENT}")
    assert not transactional(good) and lint([good]) == []
    inside = scratch(tmp_path, f"{NEXT}_inside.sql", f"{HEAD}{CONCURRENT}")  # yoyo's default
    assert lint([inside]) == [
        (f"{NEXT}_inside.sql", "ban-concurrent-index-creation-in-transaction")
    ]


def test_yoyo_builds_a_concurrent_index_outside_a_transaction(
    fresh_database: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The recipe of docs/development.md works: yoyo applies a `-- transactional: false` file
    statement by statement in autocommit, so CREATE INDEX CONCURRENTLY runs (it refuses a
    transaction)."""
    from satchel.server.platform.storage import migrations

    directory = tmp_path / "migrations"
    shutil.copytree(ROOT / "migrations", directory, ignore=shutil.ignore_patterns("__*"))
    scratch(directory, f"{NEXT}_concurrent.sql", f"{HEAD}-- transactional: false\n{CONCURRENT}")
    monkeypatch.setattr(migrations, "migrations_directory", lambda: str(directory))
    applied = migrations.apply_migrations(fresh_database)
    assert applied[-1] == f"{NEXT}_concurrent"
    with psycopg.connect(fresh_database) as conn:
        row = conn.execute(
            "SELECT indisvalid FROM pg_index WHERE indexrelid = 'facts_subject_scratch'::regclass"
        ).fetchone()
    assert row == (True,)
    assert migrations.apply_migrations(fresh_database) == []  # recorded once


def test_a_replica_waiting_to_migrate_never_blocks_a_concurrent_index(fresh_database: str) -> None:
    """While one replica migrates (holding the lock) and builds an index concurrently, another
    waiting for the lock must hold no snapshot, or the build would wait for it forever."""
    from satchel.server.platform.storage.migrations import MIGRATION_LOCK_KEY, apply_migrations

    apply_migrations(fresh_database)
    with psycopg.connect(fresh_database, autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK_KEY,))
        waiting = threading.Thread(target=apply_migrations, args=(fresh_database,))
        waiting.start()
        try:
            deadline = time.monotonic() + 30
            while not holder.execute(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE query LIKE 'SELECT pg_%%advisory_lock(%%' AND pid <> pg_backend_pid()"
            ).fetchone()[0]:
                assert time.monotonic() < deadline, "the second replica never tried the lock"
                time.sleep(0.05)
            time.sleep(0.3)  # it is waiting now
            with psycopg.connect(fresh_database, autocommit=True) as builder:
                builder.execute("SET statement_timeout = '20s'")  # a hang fails, never blocks
                builder.execute("CREATE INDEX CONCURRENTLY facts_waited ON facts (subject_id)")
        finally:
            holder.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK_KEY,))
        waiting.join(30)
    assert not waiting.is_alive()


def test_the_development_page_documents_the_rule() -> None:
    page = (ROOT / "docs" / "development.md").read_text()
    assert re.search(r"-- transactional: false", page)
    assert "CREATE INDEX CONCURRENTLY" in page and ".squawk.toml" in page
