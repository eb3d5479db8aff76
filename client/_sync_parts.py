"""The hand-written parts of the blocking client: the few places where it is not the asyncio one.

`client/_sync.py` is generated from `client/_aio.py` by `scripts/generate-sync-client`, which
turns the asyncio code into blocking code mechanically, except for what is written here:

- each top-level class (or function) replaces, whole, the one of `_aio.py` that has its name once
  made blocking: `Stream` replaces `AsyncStream`, as iterating a blocking call is another
  protocol (`next(call)` raising `grpc.RpcError`; no `asyncio.CancelledError`);
- `MODULE_DOCSTRING` and `DOCSTRINGS` (by qualified name, as named in `_sync.py`) replace the
  docstrings whose asyncio wording would be wrong for the blocking client.

Nothing imports this module: the generator copies its code into `_sync.py` (with the imports of
`_aio.py`). It is linted and type-checked here like the rest of the SDK.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Generic, TypeVar

import grpc

from satchel.client.errors import SatchelError

T = TypeVar("T")

MODULE_DOCSTRING = (
    "`SatchelClient`: the blocking client (one method per RPC of the three services)."
)

DOCSTRINGS: dict[str, str] = {
    "SatchelClient": """Blocking client of a satchel server.

    Every method returns the RPC's response message (`satchel.v1`), streams yield the
    response messages, failures raise `SatchelError`. Each call has a deadline of `timeout`
    seconds (None: no deadline) unless the call passes its own; WatchTraces has none by default.
    Idempotent reads (see `IDEMPOTENT_READS`) are retried on UNAVAILABLE per `retry`, by gRPC
    itself (the channel's service config, `service_config(retry)`); writes and streams never
    are. A `channel` of your own retries only as its own options say. `api_key` is sent as
    `authorization: Bearer <key>`.

    `address` is one gRPC target (`host:port`, `dns:///name:port`: every address the name
    resolves to) or a list of `IP:port` addresses (see `channel_target`); calls are balanced
    over them with `round_robin` (the service config's `loadBalancingConfig`).
    """,
}


class Stream(Generic[T]):
    """A server stream: iterate it for the messages; `cancel()` (or leaving a `with`) ends it.

    Errors are raised as `SatchelError` while iterating; after `cancel()` iteration just stops.
    """

    def __init__(self, call: Any) -> None:
        self._call = call
        self._cancelled = False

    def __iter__(self) -> Iterator[T]:
        return self

    def __next__(self) -> T:
        try:
            message: T = next(self._call)
        except grpc.RpcError as exc:
            if self._cancelled and exc.code() == grpc.StatusCode.CANCELLED:
                raise StopIteration from None
            raise SatchelError.from_rpc_error(exc) from exc
        return message

    def cancel(self) -> None:
        """Cancel the call; the server stops sending."""
        self._cancelled = True
        self._call.cancel()

    def __enter__(self) -> Stream[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.cancel()
