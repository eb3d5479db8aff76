"""ContextService: the gRPC face of context assembly."""

from __future__ import annotations

from satchel.server.runtime import RuntimeRef
from satchel.v1 import context_pb2_grpc


class ContextServicer(context_pb2_grpc.ContextServiceServicer):
    """Thin adapter over the domain. Until issue 4 lands, the generated base answers every
    RPC with NotImplementedError, which the interceptor turns into UNIMPLEMENTED."""

    def __init__(self, runtime: RuntimeRef) -> None:
        self._runtime = runtime
