"""What both clients share: call options, the retry policy, metadata, method names."""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import grpc

DEFAULT_ADDRESS = "127.0.0.1:50051"
DEFAULT_TIMEOUT = 30.0
"""Seconds: the deadline of every unary call and of StreamContext, unless configured."""

CONTEXT = "satchel.v1.ContextService"
MEMORY = "satchel.v1.MemoryService"
TALENTS = "satchel.v1.TalentService"

IDEMPOTENT_READS: frozenset[str] = frozenset(
    {
        f"/{CONTEXT}/GetTrace",
        f"/{CONTEXT}/GetStatsOverview",
        f"/{MEMORY}/ListFacts",
        f"/{MEMORY}/ListEvents",
        f"/{MEMORY}/ListConflicts",
        f"/{TALENTS}/ListTalents",
        f"/{TALENTS}/DiagnoseProject",
        f"/{TALENTS}/ResolveTalents",
    }
)
"""The only methods the clients retry (on UNAVAILABLE): reads that are safe to repeat."""

Metadata = Sequence[tuple[str, str]]


@dataclass(frozen=True)
class RetryPolicy:
    """Retries of idempotent reads on UNAVAILABLE: exponential backoff with full jitter.

    `max_attempts` counts the first call; every attempt stays within the call's deadline.
    """

    max_attempts: int = 4
    initial_backoff: float = 0.1
    max_backoff: float = 2.0
    multiplier: float = 2.0
    retryable_codes: frozenset[grpc.StatusCode] = frozenset({grpc.StatusCode.UNAVAILABLE})

    def backoffs(self) -> Iterator[float]:
        """Seconds to sleep before each retry (max_attempts - 1 of them)."""
        ceiling = self.initial_backoff
        for _ in range(self.max_attempts - 1):
            yield random.uniform(0, min(ceiling, self.max_backoff))
            ceiling *= self.multiplier


NO_RETRY = RetryPolicy(max_attempts=1)


def call_metadata(api_key: str | None, extra: Metadata = ()) -> tuple[tuple[str, str], ...]:
    """The metadata of every call: `authorization: Bearer <api_key>` when a key is set."""
    items = [("authorization", f"Bearer {api_key}")] if api_key else []
    return (*items, *extra)


def method(service: str, name: str) -> str:
    """The full gRPC method path, e.g. `/satchel.v1.ContextService/GetTrace`."""
    return f"/{service}/{name}"


def encode_health_request(service: str) -> bytes:
    """A `grpc.health.v1.HealthCheckRequest` (field 1: service), encoded by hand to stay light."""
    data = service.encode()
    return (b"\x0a" + _varint(len(data)) + data) if data else b""


def decode_health_status(data: bytes) -> str:
    """The `status` of a `grpc.health.v1.HealthCheckResponse` as its enum name."""
    names = ("UNKNOWN", "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN")
    status, index = 0, 0
    while index < len(data):
        tag, index = _read_varint(data, index)
        if tag & 7 != 0:  # only varints are expected in this message
            break
        number, index = _read_varint(data, index)
        if tag >> 3 == 1:
            status = number
    return names[status] if status < len(names) else str(status)


def _varint(number: int) -> bytes:
    out = bytearray()
    while True:
        byte, number = number & 0x7F, number >> 7
        out.append(byte | (0x80 if number else 0))
        if not number:
            return bytes(out)


def _read_varint(data: bytes, index: int) -> tuple[int, int]:
    number = shift = 0
    while index < len(data):
        byte = data[index]
        index += 1
        number |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            break
    return number, index


HEALTH_CHECK = "/grpc.health.v1.Health/Check"
