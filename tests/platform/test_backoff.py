"""The wait schedule shared by the server's retry loops (`Backoff`), and the three loops that
use it: embedded PostgreSQL restarts, worker restarts, WatchTraces listener reconnections."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Coroutine
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import psycopg
import pytest

from satchel.server.context import watch
from satchel.server.platform import app, processes
from satchel.server.platform.backoff import Backoff


def test_waits_double_up_to_the_cap_and_stay_there() -> None:
    backoff = Backoff(0.5, 30.0)
    assert [backoff.next() for _ in range(9)] == [0.5, 1, 2, 4, 8, 16, 30, 30, 30]
    listener = Backoff(0.2, 5.0)
    assert [round(listener.next(), 6) for _ in range(7)] == [0.2, 0.4, 0.8, 1.6, 3.2, 5, 5]


def test_reset_after_a_success_starts_from_the_first_wait_again() -> None:
    backoff = Backoff(0.5, 30.0)
    for _ in range(20):
        backoff.next()
    backoff.reset()
    assert [backoff.next() for _ in range(3)] == [0.5, 1, 2]


def test_a_loop_failing_for_ever_keeps_the_cap() -> None:
    backoff = Backoff(0.5, 30.0)
    waits = [backoff.next() for _ in range(5000)]  # initial * 2**5000 would overflow a float
    assert waits[-1] == 30.0


@pytest.mark.parametrize(("initial", "cap", "factor"), [(0, 1, 2), (2, 1, 2), (1, 2, 0.5)])
def test_a_schedule_that_would_not_back_off_is_refused(
    initial: float, cap: float, factor: float
) -> None:
    with pytest.raises(ValueError, match="a backoff needs"):
        Backoff(initial, cap, factor)


# --- the three loops, each driven on its own event loop with a recording asyncio.sleep --------


class _Stop(Exception):
    """Ends a loop that otherwise never ends."""


def _waits(
    monkeypatch: pytest.MonkeyPatch, count: int, coro: Coroutine[Any, Any, None]
) -> list[float]:
    """The waits (seconds) of a retry loop up to its `count`-th sleep (a sync test: the session's
    event loop is idle, so patching asyncio.sleep reaches only this loop)."""
    waits: list[float] = []

    async def sleep(delay: float) -> None:
        waits.append(delay)
        if len(waits) == count:
            raise _Stop

    monkeypatch.setattr(asyncio, "sleep", sleep)
    loop = asyncio.new_event_loop()
    try:
        with pytest.raises(_Stop):
            loop.run_until_complete(coro)
    finally:
        monkeypatch.undo()
        loop.run_until_complete(loop.shutdown_default_executor())
        loop.close()
    return [round(wait, 6) for wait in waits]


class _ExitingProcess:
    """A worker process that has already exited when the primary looks."""

    pid, exitcode = 4242, 1

    def __init__(self, **_: Any) -> None:
        pass

    def start(self) -> None:
        pass


@pytest.mark.parametrize(("stable_seconds", "expected"), [
    (60.0, [0.5, 1, 2, 4, 8, 16, 30, 30]),  # keeps exiting at once: doubling to the cap
    (0.0, [0.5] * 8),  # each ran "long enough": reset, the shortest wait every time
])  # fmt: skip
def test_worker_restarts_wait_longer_while_a_worker_keeps_exiting(
    monkeypatch: pytest.MonkeyPatch, stable_seconds: float, expected: list[float]
) -> None:
    monkeypatch.setattr(processes, "STABLE_SECONDS", stable_seconds)
    monkeypatch.setattr(processes, "worker_settings", lambda *_: None)
    workers = processes.WorkerProcesses(None, "dsn", 0)  # type: ignore[arg-type]
    workers._context = SimpleNamespace(Process=_ExitingProcess)  # type: ignore[assignment]
    assert _waits(monkeypatch, 8, workers._keep(1)) == expected


class _Embedded:
    """An embedded PostgreSQL that is never running and whose restarts fail as scripted."""

    def __init__(self, outcomes: list[bool]) -> None:
        self.outcomes = outcomes

    def is_running(self) -> bool:
        return False

    def restart(self) -> None:
        if not self.outcomes.pop(0):
            raise RuntimeError("old backends still hold the shared memory")


def test_the_postgres_supervisor_backs_off_after_failed_starts_and_resets_after_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    outcomes = [False] * 8 + [True] + [False] * 2
    server = SimpleNamespace(
        probe=SimpleNamespace(up=False),
        _embedded=_Embedded(outcomes),
        postgres_restarts=0,
        telemetry=SimpleNamespace(observe_postgres_restart=lambda: None),
    )
    supervising = app.SatchelServer._supervise_postgres(server)  # type: ignore[arg-type]
    waits = _waits(monkeypatch, 11, supervising)
    # After a restart it looks again in 0.5 s (the probe may not have seen the database yet).
    assert waits == [0.5, 1, 2, 4, 8, 16, 30, 30, 0.5, 0.5, 1]
    assert server.postgres_restarts == 1


class _Connection:
    """A LISTEN connection that is up until it waits for notifications, then is lost."""

    info = SimpleNamespace(backend_pid=7)

    async def __aenter__(self) -> _Connection:
        return self

    async def __aexit__(self, *_: object) -> None:
        pass

    async def execute(self, query: str) -> Any:
        async def fetchone() -> tuple[datetime]:
            return (datetime.now(UTC),)

        return SimpleNamespace(fetchone=fetchone)

    async def notifies(self, timeout: float) -> AsyncIterator[Any]:
        raise psycopg.OperationalError("terminating connection due to administrator command")
        yield


def test_the_watch_listener_reconnects_with_backoff_reset_once_connected(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    attempts = iter([False] * 6 + [True] + [False] * 3)

    async def connect(*_: Any, **__: Any) -> _Connection:
        if not next(attempts):
            raise psycopg.OperationalError("connection refused")
        return _Connection()

    monkeypatch.setattr(psycopg.AsyncConnection, "connect", connect)

    async def listen() -> None:
        hub = watch.TraceHub("dsn", None, queue_size=1)  # type: ignore[arg-type]
        await hub._listen_forever()

    waits = _waits(monkeypatch, 10, listen())
    assert waits == [0.2, 0.4, 0.8, 1.6, 3.2, 5, 0.2, 0.4, 0.8, 1.6]
