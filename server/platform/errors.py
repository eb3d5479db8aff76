"""Errors the services raise, and their translation into rich gRPC statuses.

Service code raises `ServiceError` subclasses; the interceptor turns them into a
`google.rpc.Status` with `BadRequest` field violations and an `ErrorInfo` reason.
"""

from __future__ import annotations

from collections.abc import Iterable

import grpc
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2

ERROR_DOMAIN = "satchel.dev"

# A status travels in HTTP/2 trailers, which clients refuse past 8-16 KiB: a request full of
# huge bad fields (a 10k-character JSON key, thousands of violations) must not turn its
# INVALID_ARGUMENT into a RESOURCE_EXHAUSTED "metadata size exceeds hard limit". Sizes in bytes.
MAX_STATUS_VIOLATIONS = 10
MAX_STATUS_FIELD_BYTES = 100
MAX_STATUS_TEXT_BYTES = 200
MAX_STATUS_MESSAGE_BYTES = 512


def clip(text: str, limit: int) -> str:
    """`text` cut to at most `limit` UTF-8 bytes (ending with "…" when cut)."""
    data = text.encode()
    if len(data) <= limit:
        return text
    return data[: limit - 3].decode(errors="ignore") + "…"


class ServiceError(Exception):
    """An expected failure with a gRPC code, a message and an ErrorInfo reason."""

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL

    def __init__(
        self,
        message: str,
        *,
        reason: str = "",
        violations: Iterable[tuple[str, str]] = (),
        metadata: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason
        self.violations = list(violations)
        self.metadata = metadata or {}

    def to_status(self) -> status_pb2.Status:
        """The google.rpc.Status carrying this error's details."""
        details: list[any_pb2.Any] = []
        if self.violations:
            shown = [
                (clip(f, MAX_STATUS_FIELD_BYTES), clip(d, MAX_STATUS_TEXT_BYTES))
                for f, d in self.violations[:MAX_STATUS_VIOLATIONS]
            ]
            if len(self.violations) > MAX_STATUS_VIOLATIONS:
                more = len(self.violations) - MAX_STATUS_VIOLATIONS
                shown.append(("…", f"and {more} more violations"))
            bad_request = error_details_pb2.BadRequest(
                field_violations=[
                    error_details_pb2.BadRequest.FieldViolation(field=f, description=d)
                    for f, d in shown
                ]
            )
            packed = any_pb2.Any()
            packed.Pack(bad_request)
            details.append(packed)
        if self.reason:
            metadata = {
                clip(k, MAX_STATUS_FIELD_BYTES): clip(v, MAX_STATUS_TEXT_BYTES)
                for k, v in self.metadata.items()
            }
            info = error_details_pb2.ErrorInfo(
                reason=self.reason, domain=ERROR_DOMAIN, metadata=metadata
            )
            packed = any_pb2.Any()
            packed.Pack(info)
            details.append(packed)
        return status_pb2.Status(
            code=getattr(code_pb2, self.code.name),
            message=clip(self.message, MAX_STATUS_MESSAGE_BYTES),
            details=details,
        )


class InvalidArgument(ServiceError):
    code = grpc.StatusCode.INVALID_ARGUMENT

    def __init__(
        self,
        violations: Iterable[tuple[str, str]],
        *,
        reason: str = "INVALID_ARGUMENT",
        message: str | None = None,
    ) -> None:
        violations = list(violations)
        text = message or "; ".join(f"{field}: {why}" for field, why in violations)
        super().__init__(text, reason=reason, violations=violations)


class NotFound(ServiceError):
    code = grpc.StatusCode.NOT_FOUND


class FailedPrecondition(ServiceError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class AlreadyExists(ServiceError):
    code = grpc.StatusCode.ALREADY_EXISTS


class Unavailable(ServiceError):
    code = grpc.StatusCode.UNAVAILABLE


class Unimplemented(ServiceError):
    code = grpc.StatusCode.UNIMPLEMENTED


class Unauthenticated(ServiceError):
    code = grpc.StatusCode.UNAUTHENTICATED


class PermissionDenied(ServiceError):
    code = grpc.StatusCode.PERMISSION_DENIED


class ResourceExhausted(ServiceError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class Violations:
    """Collects field violations, then raises them all at once."""

    def __init__(self) -> None:
        self.items: list[tuple[str, str]] = []

    def add(self, field: str, description: str) -> None:
        self.items.append((field, description))

    def check(self, condition: bool, field: str, description: str) -> None:
        if not condition:
            self.add(field, description)

    def raise_if_any(self, reason: str = "INVALID_ARGUMENT") -> None:
        if self.items:
            raise InvalidArgument(self.items, reason=reason)
