"""Fair admission of calls: a flood from one client never starves the others.

At most `active` calls run at once. A call beyond that waits its turn, and turns go to clients
in rotation (round robin), not to calls in arrival order: a client with a thousand calls
waiting delays another client's call by at most one call of its own. A client may have at most
`per_client` calls running or waiting, and all clients together `total`; one more is refused at
once with RESOURCE_EXHAUSTED, so waiting costs bounded memory.

A slot is a lease of `lease` seconds (0.25 s: several context calls): a call still running
then (waiting on a lock, a slow disk, a slow reader of its stream) stops counting, and the next
call starts. A stuck call holds the others back for a lease, never for as long as it is stuck.

A client is its API key, or (auth off) its connection. Pure asyncio, no I/O: `AccessInterceptor`
(server/auth.py) puts every satchel.v1 call but the long-lived `WatchTraces` through it.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from satchel.server.errors import ResourceExhausted


class FairAdmission:
    """Round-robin admission of calls to `active` running slots (see the module)."""

    def __init__(self, active: int, per_client: int, total: int, lease: float = 0.25) -> None:
        self.active = active
        self.per_client = per_client
        self.total = total
        self.lease = lease
        self.running = 0
        self._calls: dict[str, int] = {}  # running or waiting, per client
        self._all = 0  # running or waiting, every client
        self._waiting: OrderedDict[str, deque[asyncio.Future[None]]] = OrderedDict()

    @property
    def waiting(self) -> int:
        return sum(len(queue) for queue in self._waiting.values())

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
        self._all += 1
        loop = asyncio.get_running_loop()
        slot: list[bool] = []  # [held]: the call counts among the running ones
        expiry: asyncio.TimerHandle | None = None
        try:
            if self.running < self.active and not self._waiting:
                self.running += 1
                slot.append(True)
            else:
                turn: asyncio.Future[None] = loop.create_future()
                self._waiting.setdefault(client, deque()).append(turn)
                try:
                    await turn
                    slot.append(True)
                except asyncio.CancelledError:
                    if turn.done() and not turn.cancelled():
                        slot.append(True)  # the turn came as the call was cancelled: hand it on
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
            self._all -= 1
            self._free(slot)

    def _free(self, slot: list[bool]) -> None:
        """Stop counting a call among the running ones (at its end, or when its lease ends)."""
        if slot and slot[0]:
            slot[0] = False
            self.running -= 1
            self._admit_next()

    def _withdraw(self, client: str, turn: asyncio.Future[None]) -> None:
        queue = self._waiting.get(client)
        if queue is not None and turn in queue:
            queue.remove(turn)
            if not queue:
                del self._waiting[client]

    def _admit_next(self) -> None:
        """Give free slots to the next clients in rotation, one waiting call each."""
        while self.running < self.active and self._waiting:
            client, queue = next(iter(self._waiting.items()))
            turn = queue.popleft()
            if queue:
                self._waiting.move_to_end(client)  # its next call waits for the others' turns
            else:
                del self._waiting[client]
            turn.set_result(None)
            self.running += 1
