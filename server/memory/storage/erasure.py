"""SQL of `satchel purge`: what follows a deletion so that the deleted text leaves PostgreSQL's
files too, and a report of what may still hold it.

A DELETE only marks rows dead: their bytes stay in the table files until VACUUM prunes them
(and may stay in a page's free space until it is reused), and they stay in the write-ahead log
(WAL) segments written before the deletion until PostgreSQL removes or recycles them. VACUUM
FULL writes each table and its indexes into new files and drops the old ones; a checkpoint
after a WAL switch lets PostgreSQL remove every segment before it, unless a replication slot,
`wal_keep_size` or archiving keeps them. A recycled segment keeps its old bytes until it is
overwritten (`wal_recycle = off` makes PostgreSQL remove segments instead).
"""

from __future__ import annotations

from dataclasses import dataclass

from psycopg import Connection, sql

# Every table a DeleteEvent, DeleteSubject or DeleteProject deletes from.
TABLES = (
    "events",
    "facts",
    "conflict_sets",
    "conflict_members",
    "context_calls",
    "context_traces",
    "fact_term_counts",
    "scope_lexemes",
    "scope_documents",
    "scope_versions",
)


def vacuum(conn: Connection, table: str, *, full: bool) -> None:
    """VACUUM (FULL when `full`) one table, then forget and take again its statistics: ANALYZE
    of a table left empty keeps the old sample values (superuser: pg_statistic is written).
    `conn` must be in autocommit."""
    name = sql.Identifier(table)
    conn.execute(sql.SQL("VACUUM (FULL) {}" if full else "VACUUM {}").format(name))
    conn.execute(
        "DELETE FROM pg_catalog.pg_statistic WHERE starelid IN"
        " (SELECT relid FROM pg_partition_tree(%s::regclass))",  # the table, or its partitions
        (table,),
    )
    conn.execute(sql.SQL("ANALYZE {}").format(name))


def vacuum_statistics(conn: Connection, *, full: bool) -> None:
    """VACUUM the statistics catalogue, whose dead rows keep the old sample values."""
    conn.execute(
        "VACUUM (FULL) pg_catalog.pg_statistic" if full else "VACUUM pg_catalog.pg_statistic"
    )


def close_wal_segment(conn: Connection) -> None:
    """Switch to a new WAL segment and checkpoint, so that every segment before the switch may
    be removed or recycled (superuser, or the pg_checkpoint role for CHECKPOINT)."""
    conn.execute("SELECT pg_switch_wal()")
    conn.execute("CHECKPOINT")


@dataclass(frozen=True)
class WalReport:
    """What may still hold WAL written before a deletion."""

    deletion_segment: str  # the segment the deletion's commit was written to
    current_segment: str
    segments_at_or_before: int  # segments in pg_wal not after the deletion's
    segments_ahead: int  # recycled segments waiting to be written again (hold old bytes)
    wal_recycle: bool
    archive_mode: str
    slots_behind: list[str]  # replication slots that keep WAL from before the deletion

    @property
    def held_by(self) -> list[str]:
        """Why WAL written before the deletion may still be on disk, in words (none: clear)."""
        reasons = []
        if self.segments_at_or_before:
            keeper = (
                f"replication slot(s) {', '.join(self.slots_behind)}"
                if self.slots_behind
                else "wal_keep_size, or a checkpoint still running"
            )
            reasons.append(
                f"{self.segments_at_or_before} segment(s) at or before the deletion's, kept by "
                f"{keeper}"
            )
        if self.wal_recycle and self.segments_ahead:
            reasons.append(
                f"{self.segments_ahead} recycled segment(s) keep old bytes until overwritten "
                "(set wal_recycle = off to remove segments instead)"
            )
        if self.archive_mode != "off":
            reasons.append(f"archive_mode is {self.archive_mode}: archived WAL is kept elsewhere")
        return reasons

    @property
    def clear(self) -> bool:
        """No WAL file of this server may hold what was written before the deletion."""
        return not self.held_by


def wal_report(conn: Connection, deletion_lsn: str) -> WalReport:
    """The WAL segments and settings that may keep what was written before `deletion_lsn`
    (superuser, or pg_monitor for `pg_ls_waldir`)."""
    row = conn.execute(
        """
        WITH files AS (
            SELECT name FROM pg_ls_waldir() WHERE name ~ '^[0-9A-F]{24}$'
        ), marks AS (
            SELECT pg_walfile_name(%(lsn)s::pg_lsn) AS deletion,
                   pg_walfile_name(pg_current_wal_lsn()) AS current
        )
        SELECT m.deletion, m.current,
               (SELECT count(*) FROM files f WHERE f.name <= m.deletion),
               (SELECT count(*) FROM files f WHERE f.name > m.current),
               current_setting('wal_recycle')::bool,
               current_setting('archive_mode'),
               ARRAY(SELECT slot_name::text FROM pg_replication_slots
                     WHERE restart_lsn IS NOT NULL AND restart_lsn <= %(lsn)s::pg_lsn
                     ORDER BY slot_name)
        FROM marks m
        """,
        {"lsn": deletion_lsn},
    ).fetchone()
    assert row is not None
    return WalReport(
        deletion_segment=row[0],
        current_segment=row[1],
        segments_at_or_before=int(row[2]),
        segments_ahead=int(row[3]),
        wal_recycle=bool(row[4]),
        archive_mode=str(row[5]),
        slots_behind=list(row[6]),
    )


def current_lsn(conn: Connection) -> str:
    """The WAL position now: a deletion acknowledged earlier was written before it."""
    row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
    assert row is not None
    return str(row[0])
