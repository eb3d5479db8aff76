"""The one wait schedule of the server's retry loops: doubling from a first wait to a longest.

Three loops use it: the supervisor that restarts the embedded PostgreSQL (`app.py`, 0.5 s
doubling to 30 s after a failed start), the primary's restarts of its workers (`processes.py`,
0.5 s doubling to 30 s while a worker keeps exiting within a minute) and the WatchTraces
listener's reconnections (`context/watch.py`, 0.2 s doubling to 5 s).

Why not a retry library (tenacity, backoff): none of the three is "call this until it
succeeds". A worker is restarted forever, whenever it exits; the supervisor and the listener run
until the server cancels them at shutdown; each logs every failure with the wait that follows;
and the wait goes back to the first after a success in the middle of a long-lived attempt (a
worker that ran a minute, a LISTEN connection that was up). A library would wrap each asyncio
loop in its retry object, with callbacks for the logging and a way around its own attempt count
for the reset, and add a dependency for a multiplication and a `min`. No jitter (none of the
loops had one): a worker process, the server's own database and one LISTEN connection per
replica are not a crowd of clients retrying a shared service at once.
"""

from __future__ import annotations


class Backoff:
    """Waits of `initial` seconds, each next one `factor` times longer, never above `cap`;
    `reset()` (after a success) starts again from `initial`.

    `next()` is 0.5, 1, 2, 4, … 30, 30, … for `Backoff(0.5, 30.0)`.
    """

    def __init__(self, initial: float, cap: float, factor: float = 2.0) -> None:
        if not 0 < initial <= cap or factor < 1:
            raise ValueError(f"a backoff needs 0 < initial <= cap and factor >= 1: {initial}")
        self.initial = initial
        self.cap = cap
        self.factor = factor
        self._last: float | None = None  # the wait next() returned last; None: from initial

    def next(self) -> float:
        """The wait before the next attempt (seconds); each call returns a longer one."""
        wait = self.initial if self._last is None else min(self._last * self.factor, self.cap)
        self._last = wait
        return wait

    def reset(self) -> None:
        """After a success: the next wait is `initial` again."""
        self._last = None
