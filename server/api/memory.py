"""MemoryService: the gRPC face of the write path."""

from __future__ import annotations

from satchel.server.runtime import RuntimeRef
from satchel.v1 import memory_pb2_grpc


class MemoryServicer(memory_pb2_grpc.MemoryServiceServicer):
    """Thin adapter over the domain. Until issue 3 lands, the generated base answers every
    RPC with NotImplementedError, which the interceptor turns into UNIMPLEMENTED."""

    def __init__(self, runtime: RuntimeRef) -> None:
        self._runtime = runtime
