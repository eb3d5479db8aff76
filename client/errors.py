"""`SatchelError`: a failed call, with the details of satchel's rich gRPC statuses."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import cast

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status


@dataclass(frozen=True)
class FieldViolation:
    """One invalid field of a request (`google.rpc.BadRequest.FieldViolation`)."""

    field: str
    description: str


@dataclass(eq=False)
class SatchelError(Exception):
    """A call that failed: gRPC code, message, field violations and ErrorInfo reason.

    `reason` is the `google.rpc.ErrorInfo` reason (e.g. `BUDGET_EXCEEDED`, `TRACE_NOT_FOUND`),
    empty when the status carries none (deadlines, connection failures).
    """

    code: grpc.StatusCode
    message: str
    field_violations: tuple[FieldViolation, ...] = ()
    reason: str = ""
    domain: str = ""
    metadata: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__init__(self.message)

    def __str__(self) -> str:
        """`CODE: message`, then one indented `field: description` line per violation that the
        message does not already spell out."""
        lines = [f"{self.code.name}: {self.message}"]
        for v in self.field_violations:
            if f"{v.field}: {v.description}" not in self.message:
                lines.append(f"  {v.field}: {v.description}")
        return "\n".join(lines)

    @property
    def violations(self) -> dict[str, str]:
        """The field violations as `{field: description}`."""
        return {v.field: v.description for v in self.field_violations}

    @classmethod
    def from_rpc_error(cls, error: grpc.RpcError) -> SatchelError:
        """Read a grpc (sync or aio) error and its `google.rpc.Status` details, if any."""
        code: grpc.StatusCode = error.code()
        message: str = error.details() or ""
        violations: list[FieldViolation] = []
        reason = domain = ""
        metadata: dict[str, str] = {}
        try:
            # A failed call's error is its call (sync) or holds its code, details and trailing
            # metadata (aio): what `from_call` reads.
            status = rpc_status.from_call(cast(grpc.Call, error))
        except (ValueError, AttributeError):  # a status that contradicts the call's code
            status = None
        for detail in status.details if status is not None else ():
            if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
                bad = error_details_pb2.BadRequest()
                detail.Unpack(bad)
                violations += [FieldViolation(v.field, v.description) for v in bad.field_violations]
            elif detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                detail.Unpack(info)
                reason, domain, metadata = info.reason, info.domain, dict(info.metadata)
        return cls(code, message, tuple(violations), reason, domain, metadata)
