"""TalentService: the gRPC face of the talent catalogue and selection."""

from __future__ import annotations

from satchel.server.runtime import RuntimeRef
from satchel.v1 import talent_pb2_grpc


class TalentServicer(talent_pb2_grpc.TalentServiceServicer):
    """Thin adapter over the domain. Until issue 5 lands, the generated base answers every
    RPC with NotImplementedError, which the interceptor turns into UNIMPLEMENTED."""

    def __init__(self, runtime: RuntimeRef) -> None:
        self._runtime = runtime
