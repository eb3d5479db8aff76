"""Fair admission of calls: a flood from one client never starves the others.

At most `active` calls run at once, shared fairly: while several clients are present, each may
run at most its share of `active` (`active` over their number, at least one), and a client
present alone may use them all. A client is present while it has calls running or waiting, and
for `lease` seconds after its last one ended (so that a client calling in sequence keeps its
share between two calls). A call beyond its client's share waits its turn; turns go to clients
in rotation (round robin), not to calls in arrival order. A client with no call running waits
for no turn: its call runs at once, beyond `active` if need be (up to `active + newcomers`), and
so does its oldest waiting call as soon as its last running one ends; calls of one client run in
arrival order.

So a client with a thousand calls waiting delays another client's call only by sharing the CPU
with its share of running calls. A client may have at most `per_client` calls running or
waiting, and all clients together `total`; one more is refused at once with
RESOURCE_EXHAUSTED, so waiting costs bounded memory.

A slot is a lease of `lease` seconds (0.25 s: several context calls): a call still running
then (waiting on a lock, a slow disk, a slow reader of its stream) stops counting, and the next
call starts. A stuck call holds the others back for a lease, never for as long as it is stuck.

A client is its API key, or (auth off) its connection. Pure asyncio, no I/O: `AccessInterceptor`
(server/platform/auth.py) puts every satchel.v1 call but the long-lived `WatchTraces` through it.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from satchel.server.platform.errors import ResourceExhausted


class _Slot:
    """One call's claim on a running slot."""

    __slots__ = ("client", "held")

    def __init__(self, client: str) -> None:
        self.client = client
        self.held = False


class FairAdmission:
    """Fair-share, round-robin admission of calls to `active` running slots (see the module)."""

    def __init__(
        self,
        active: int,
        per_client: int,
        total: int,
        lease: float = 0.25,
        newcomers: int | None = None,
    ) -> None:
        self.active = active
        self.per_client = per_client
        self.total = total
        self.lease = lease
        self.ceiling = active + (active if newcomers is None else newcomers)
        self.running = 0
        self._running: dict[str, int] = {}  # counted among the running ones, per client
        self._calls: dict[str, int] = {}  # running or waiting, per client
        self._all = 0  # running or waiting, every client
        self._waiting: OrderedDict[str, deque[asyncio.Future[None]]] = OrderedDict()
        self._ended: OrderedDict[str, float] = OrderedDict()  # idle clients: their last call's end

    @property
    def waiting(self) -> int:
        return sum(len(queue) for queue in self._waiting.values())

    def share(self) -> int:
        """Running calls each present client may have."""
        horizon = time.monotonic() - self.lease
        while self._ended and next(iter(self._ended.values())) < horizon:
            self._ended.popitem(last=False)
        return max(1, self.active // (len(self._calls) + len(self._ended)))

    def _refuse_beyond_limits(self, client: str) -> None:
        mine = self._calls.get(client, 0)
        if mine >= self.per_client:
            raise ResourceExhausted(
                f"this client already has {mine} calls running or waiting"
                f" (the limit is {self.per_client})",
                reason="TOO_MANY_CALLS",
                metadata={"limit": str(self.per_client)},
            )
        if self._all >= self.total:
            raise ResourceExhausted(
                f"the server has {self.total} calls running or waiting, retry later",
                reason="SERVER_BUSY",
                metadata={"limit": str(self.total)},
            )

    @asynccontextmanager
    async def slot(self, client: str) -> AsyncIterator[None]:
        """Run the body once a slot is this client's turn (RESOURCE_EXHAUSTED beyond limits)."""
        self._refuse_beyond_limits(client)
        self._calls[client] = self._calls.get(client, 0) + 1
        self._ended.pop(client, None)
        self._all += 1
        loop = asyncio.get_running_loop()
        slot = _Slot(client)
        expiry: asyncio.TimerHandle | None = None
        try:
            if self._may_run_now(client):
                self._count(client)
                slot.held = True
            else:
                turn: asyncio.Future[None] = loop.create_future()
                self._waiting.setdefault(client, deque()).append(turn)
                try:
                    await turn
                    slot.held = True  # counted by `_admit_next`
                except asyncio.CancelledError:
                    if turn.done() and not turn.cancelled():
                        slot.held = True  # the turn came as the call was cancelled: hand it on
                    else:
                        self._withdraw(client, turn)
                    raise
            expiry = loop.call_later(self.lease, self._free, slot)
            yield
        finally:
            if expiry is not None:
                expiry.cancel()
            count = self._calls[client] - 1
            if count:
                self._calls[client] = count
            else:
                del self._calls[client]
                self._ended[client] = time.monotonic()
            self._all -= 1
            self._free(slot)

    def _may_run_now(self, client: str) -> bool:
        mine = self._running.get(client, 0)
        if mine == 0 and client not in self._waiting:
            return self.running < self.ceiling
        return self.running < self.active and not self._waiting and mine < self.share()

    def _count(self, client: str) -> None:
        self.running += 1
        self._running[client] = self._running.get(client, 0) + 1

    def _free(self, slot: _Slot) -> None:
        """Stop counting a call among the running ones (at its end, or when its lease ends)."""
        if slot.held:
            slot.held = False
            self.running -= 1
            count = self._running[slot.client] - 1
            if count:
                self._running[slot.client] = count
            else:
                del self._running[slot.client]
            self._admit_next()

    def _withdraw(self, client: str, turn: asyncio.Future[None]) -> None:
        queue = self._waiting.get(client)
        if queue is not None and turn in queue:
            queue.remove(turn)
            if not queue:
                del self._waiting[client]

    def _admit_next(self) -> None:
        """Give free slots to waiting clients, one call each: in rotation to those below their
        share while fewer than `active` run, then, up to the ceiling, to those with no call
        running (as a newcomer's call would run: the client's own next call never overtakes it).
        """
        while self._waiting:
            if self.running < self.active:
                share = self.share()
                below = (name for name in self._waiting if self._running.get(name, 0) < share)
            elif self.running < self.ceiling:
                below = (name for name in self._waiting if name not in self._running)
            else:
                return
            client = next(below, None)
            if client is None:
                return  # every waiting client runs its share: the next call to end admits
            queue = self._waiting[client]
            turn = queue.popleft()
            if queue:
                self._waiting.move_to_end(client)  # its next call waits for the others' turns
            else:
                del self._waiting[client]
            turn.set_result(None)
            self._count(client)
