"""What satchel asks of its PostgreSQL server (pure: versions in, problems out)."""

from __future__ import annotations

from satchel.server.platform.storage.migrations import version_problems


def test_supported_servers_have_no_problem() -> None:
    assert version_problems(150000, "0.8.0") == []
    assert version_problems(180004, "0.8.5") == []
    assert version_problems(170002, "1.0.0") == []


def test_old_postgres_and_old_or_missing_pgvector_are_named() -> None:
    assert version_problems(140011, "0.8.0") == [
        "PostgreSQL >= 15 is needed, this server runs 14.11"
    ]
    assert version_problems(160000, "0.7.4") == [
        "pgvector >= 0.8 is needed (iterative index scans), found 0.7.4"
    ]
    assert version_problems(130000, None) == [
        "PostgreSQL >= 15 is needed, this server runs 13.0",
        "the pgvector extension (>= 0.8) is not available on this server",
    ]
