"""`satchel purge`: after a deletion, take the deleted text out of PostgreSQL's files too, and
report what may still hold it (docs/memory.md "Forgetting on disk")."""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict

from satchel.server.memory.storage.erasure import WalReport
from satchel.server.platform.config import Settings

EXIT_CLEAR, EXIT_HELD, EXIT_REFUSED = 0, 3, 2


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    purge = commands.add_parser(
        "purge",
        help="vacuum what deletions left in the database files and report the WAL that may "
        "still hold it",
        description="VACUUM (FULL with --full) the tables deletions touch and PostgreSQL's "
        "statistics, switch the WAL and checkpoint, then report whether any WAL segment "
        "written before the deletion is still in pg_wal. Exit 0 when none may hold it, 3 "
        "when some may (the report says why), 2 when the database role may not do it. "
        "Works on SATCHEL_DATABASE_URL, else the embedded database (as superuser).",
    )
    purge.add_argument(
        "--token",
        help="the consistency_token a Delete* call answered (default: now, i.e. every "
        "deletion acknowledged before this command)",
    )
    purge.add_argument(
        "--full",
        action="store_true",
        help="VACUUM FULL: rewrite each table and its indexes into new files (locks each "
        "table while it is rewritten; without it, freed space may keep old bytes until reused)",
    )
    purge.add_argument(
        "--wait",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="checkpoint again every second until no WAL segment may hold the deleted text, "
        "for at most this long (default 0: report once)",
    )
    purge.add_argument("--json", action="store_true", help="print the report as JSON")
    purge.set_defaults(func=cmd_purge)


def cmd_purge(args: argparse.Namespace, settings: Settings) -> int:
    import psycopg

    from satchel.server.memory.storage import erasure
    from satchel.server.platform.storage.embedded import database_url_or_embedded

    if not settings.database_url:
        settings.require_embedded_database()
    with (
        database_url_or_embedded(settings.database_url, settings.data_dir) as dsn,
        psycopg.connect(dsn, autocommit=True) as conn,
    ):
        try:
            deletion = args.token or erasure.current_lsn(conn)
            for table in erasure.TABLES:
                started = time.monotonic()
                erasure.vacuum(conn, table, full=args.full)
                log(args, f"vacuumed {table} in {time.monotonic() - started:.1f} s")
            erasure.vacuum_statistics(conn, full=args.full)
            deadline = time.monotonic() + max(0.0, args.wait)
            while True:
                erasure.close_wal_segment(conn)
                report = erasure.wal_report(conn, deletion)
                if report.clear or time.monotonic() >= deadline:
                    break
                time.sleep(1.0)
        except psycopg.errors.InsufficientPrivilege as exc:
            print(
                f"satchel purge: the database role may not do this ({exc.diag.message_primary});"
                " run it as a superuser, or grant pg_checkpoint and pg_monitor and own the tables",
                file=sys.stderr,
            )
            return EXIT_REFUSED
        except psycopg.errors.InvalidTextRepresentation:
            print(
                f"satchel purge: --token {args.token!r} is not a consistency token", file=sys.stderr
            )
            return EXIT_REFUSED
    print_report(args, deletion, report)
    return EXIT_CLEAR if report.clear else EXIT_HELD


def log(args: argparse.Namespace, line: str) -> None:
    print(line, file=sys.stderr if args.json else sys.stdout, flush=True)


def print_report(args: argparse.Namespace, deletion: str, report: WalReport) -> None:
    reasons = report.held_by
    if args.json:
        print(json.dumps({"deletion_lsn": deletion, **asdict(report), "held_by": reasons}))
        return
    print(
        f"deletion at WAL {deletion} (segment {report.deletion_segment}); now at segment "
        f"{report.current_segment}"
    )
    if not reasons:
        print("no WAL segment in pg_wal may hold what was deleted")
    for reason in reasons:
        print(f"may still hold it: {reason}")
    print(
        "beyond the database's own files: WAL archives, base backups, replicas' disks and the "
        "file system's freed blocks are the operator's (docs/memory.md \"Forgetting on disk\")"
    )
