"""SATCHEL_PROCESSES: one port served by several server processes.

One Python process serves calls on one core at a time (the interpreter lock), and a context call
spends most of its time in Python. With SATCHEL_PROCESSES above 1 the server's first process (the
primary) listens with SO_REUSEPORT, runs the embedded PostgreSQL, the migrations and the
maintenance (trace retention, scope indexes, restarts of the embedded database) and, once it
serves, starts the others: workers that serve the same port on the primary's database and do
nothing else. The kernel spreads new connections over the processes; a connection stays with the
process that accepted it, so a client needs several connections to use several processes.

A worker listens only once its model and pools are ready (never a connection to a process that
cannot answer yet), stops gracefully on SIGTERM (SIGINT is the primary's to handle) and when its
primary is gone; the primary restarts a worker that exits (backoff 0.5 s doubling to 30 s while
it keeps exiting within a minute) and, as it stops, stops its workers before its database.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import replace
from multiprocessing.process import BaseProcess
from typing import Any

import structlog

from satchel.server.platform.backoff import Backoff
from satchel.server.platform.config import ConfigError, Settings
from satchel.server.platform.logs import configure_logging

log = structlog.get_logger(__name__)

RESTART_BACKOFF = (0.5, 30.0)  # seconds: first, longest wait before starting a worker again
STABLE_SECONDS = 60.0  # a worker that ran this long restarts after the shortest wait again
EXIT_POLL_SECONDS = 0.2
ORPHAN_POLL_SECONDS = 1.0
KILL_AFTER_GRACE_SECONDS = 5.0


def worker_settings(settings: Settings, dsn: str, port: int, index: int) -> Settings:
    """Worker `index`'s settings (1 is the first worker): the primary's, on its database and its
    bound port; its metrics, when on, on the primary's metrics port + `index` (0 stays 0)."""
    host = settings.listen.rpartition(":")[0]
    metrics = settings.metrics_listen
    if metrics:
        metrics_host, _, metrics_port = metrics.rpartition(":")
        if int(metrics_port):
            metrics = f"{metrics_host}:{int(metrics_port) + index}"
    return replace(settings, database_url=dsn, listen=f"{host}:{port}", metrics_listen=metrics)


class WorkerProcesses:
    """The primary's workers: started once it serves, restarted when they exit, stopped with it."""

    def __init__(self, settings: Settings, dsn: str, port: int) -> None:
        self.settings = settings
        self._dsn = dsn
        self._port = port
        self._context = multiprocessing.get_context("spawn")  # no fork of a running gRPC server
        self._processes: dict[int, BaseProcess] = {}
        self._keepers: list[asyncio.Task[None]] = []

    def start(self) -> None:
        """Start the workers, each kept running by a task of the primary's event loop."""
        for index in range(1, self.settings.processes):
            self._keepers.append(asyncio.create_task(self._keep(index), name=f"worker-{index}"))

    async def _keep(self, index: int) -> None:
        loop = asyncio.get_running_loop()
        backoff = Backoff(*RESTART_BACKOFF)
        while True:
            process = self._context.Process(
                target=serve_worker,
                args=(worker_settings(self.settings, self._dsn, self._port, index), os.getpid()),
                name=f"satchel-worker-{index}",
                daemon=True,  # terminated by multiprocessing should the primary exit abruptly
            )
            process.start()  # a few ms: spawn's fork and exec, not the worker's startup
            self._processes[index] = process
            started = loop.time()
            log.info("worker_started", worker=index, worker_pid=process.pid)
            while process.exitcode is None:
                await asyncio.sleep(EXIT_POLL_SECONDS)
            if loop.time() - started >= STABLE_SECONDS:
                backoff.reset()
            delay = backoff.next()
            log.warning(
                "worker_exited",
                worker=index,
                worker_pid=process.pid,
                exit_code=process.exitcode,
                restart_in_s=delay,
            )
            await asyncio.sleep(delay)

    async def stop(self) -> None:
        """Stop restarting; SIGTERM each worker, wait for it to drain (the grace period and a few
        seconds more), then kill what is left."""
        for keeper in self._keepers:
            keeper.cancel()
        await asyncio.gather(*self._keepers, return_exceptions=True)
        running = [p for p in self._processes.values() if p.is_alive()]
        for process in running:
            process.terminate()
        deadline = time.monotonic() + self.settings.shutdown_grace_seconds
        deadline += KILL_AFTER_GRACE_SECONDS

        def join_all() -> None:
            for process in running:
                process.join(max(0.0, deadline - time.monotonic()))
                if process.is_alive():
                    log.warning("worker_killed", worker_pid=process.pid)
                    process.kill()
                    process.join()

        await asyncio.to_thread(join_all)


async def run_until_stopped(
    start: Callable[[], Coroutine[Any, Any, None]],
    stop: Callable[[], Awaitable[None]],
    signals: tuple[signal.Signals, ...],
    orphaned_from: int | None = None,
) -> int:
    """Start, serve until one of `signals` (or, with `orphaned_from`, until that parent process is
    gone), then stop; 2 when the configuration prevents starting."""
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in signals:
        loop.add_signal_handler(sig, stopping.set)
    watching = asyncio.create_task(_wait_orphaned(orphaned_from, stopping))
    try:
        starting = asyncio.create_task(start())
        stop_wait = asyncio.create_task(stopping.wait())
        await asyncio.wait({starting, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
        if starting.done():
            starting.result()
            await stop_wait
        else:
            starting.cancel()
    except ConfigError as exc:
        log.error("startup_failed", error=str(exc))
        return 2
    finally:
        watching.cancel()
        log.info("shutting_down")
        await stop()
    return 0


async def _wait_orphaned(parent: int | None, stopping: asyncio.Event) -> None:
    if parent is None:
        return
    while os.getppid() == parent:
        await asyncio.sleep(ORPHAN_POLL_SECONDS)
    log.warning("primary_gone", primary_pid=parent)
    stopping.set()


def serve_worker(settings: Settings, primary_pid: int) -> None:
    """A worker process's entry point (module level: `spawn` imports it by name)."""
    from satchel.server.platform.app import SatchelServer

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C: the primary stops us
    configure_logging(settings.log_level, settings.log_format, with_pid=True)
    server = SatchelServer(settings, worker=True)
    code = asyncio.run(
        run_until_stopped(server.start, server.stop, (signal.SIGTERM,), orphaned_from=primary_pid)
    )
    raise SystemExit(code)
