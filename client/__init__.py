"""satchel.client: the light Python SDK (the `satchel-client` distribution).

It needs only grpcio, grpcio-status, grpcio-health-checking, protobuf and
googleapis-common-protos.

`SatchelClient` (blocking) and `AsyncSatchelClient` (asyncio) have one method per RPC of the
context, memory and talent services. Every method returns the RPC's response message from
`satchel.v1` (e.g. `assemble_context(...).packet`), streams yield the response messages, and
failures raise `SatchelError`. `render_packet` and `render_talents` turn results into prompt
blocks. `service_config()` is the gRPC service config (round_robin balancing, retries) the
clients use; `channel_target()` turns an address or a list of addresses into their target.
"""

from satchel.client._aio import AsyncSatchelClient, AsyncStream
from satchel.client._common import (
    DEFAULT_ADDRESS,
    DEFAULT_TIMEOUT,
    IDEMPOTENT_READS,
    RetryPolicy,
    channel_target,
    service_config,
)
from satchel.client._sync import SatchelClient, Stream
from satchel.client.errors import FieldViolation, SatchelError
from satchel.client.render import render_packet, render_talents
from satchel.client.requests import event_request, fact_request

__all__ = [
    "DEFAULT_ADDRESS",
    "DEFAULT_TIMEOUT",
    "IDEMPOTENT_READS",
    "AsyncSatchelClient",
    "AsyncStream",
    "FieldViolation",
    "RetryPolicy",
    "SatchelClient",
    "SatchelError",
    "Stream",
    "channel_target",
    "event_request",
    "fact_request",
    "render_packet",
    "render_talents",
    "service_config",
]
