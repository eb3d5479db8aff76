"""What both clients share: call options, the retry policy, metadata, method names."""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from grpc_health.v1 import health_pb2

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
        f"/{TALENTS}/SearchTools",
    }
)
"""The only methods the clients retry (on UNAVAILABLE): reads that are safe to repeat.

Writes are never retried by the client, even with an `idempotency_key` (retry those yourself
with the same key); AssembleContext and StreamContext persist a trace, so they are writes too.
"""

Metadata = Sequence[tuple[str, str]]

_HEALTH = health_pb2.DESCRIPTOR.services_by_name["Health"]
HEALTH_CHECK = f"/{_HEALTH.full_name}/{_HEALTH.methods_by_name['Check'].name}"
"""`/grpc.health.v1.Health/Check`, from grpcio-health-checking's descriptor (its messages too)."""


def health_status(reply: health_pb2.HealthCheckResponse) -> str:
    """A health reply's status by name (`SERVING`, …), a status newer than these as its number."""
    statuses = health_pb2.HealthCheckResponse.ServingStatus
    return statuses.Name(reply.status) if reply.status in statuses.values() else str(reply.status)


MAX_ATTEMPTS = 5
"""gRPC's ceiling on `maxAttempts` (gRFC A6): a larger `RetryPolicy.max_attempts` means 5."""


@dataclass(frozen=True)
class RetryPolicy:
    """Retries of idempotent reads on UNAVAILABLE: exponential backoff with full jitter.

    The clients hand it to gRPC as the `retryPolicy` of a service config (see
    `service_config`): `max_attempts` counts the first call (gRPC caps it at 5; 1 disables
    retries), the n-th retry waits a random time up to
    `min(initial_backoff * multiplier ** (n - 1), max_backoff)` seconds, and every attempt stays
    within the call's deadline (a backoff that outlasts it ends the call with
    DEADLINE_EXCEEDED, at the deadline).
    """

    max_attempts: int = 4
    initial_backoff: float = 0.1
    max_backoff: float = 2.0
    multiplier: float = 2.0
    retryable_codes: frozenset[grpc.StatusCode] = frozenset({grpc.StatusCode.UNAVAILABLE})

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("RetryPolicy.max_attempts must be at least 1")
        if self.max_attempts > 1 and not (
            self.initial_backoff > 0
            and self.max_backoff > 0
            and self.multiplier > 0
            and self.retryable_codes
        ):
            raise ValueError(
                "RetryPolicy: backoffs and multiplier must be > 0, retryable_codes not empty"
            )

    def as_service_config(self) -> dict[str, Any]:
        """The gRPC `retryPolicy` object of this policy (gRFC A6 field names)."""
        return {
            "maxAttempts": min(self.max_attempts, MAX_ATTEMPTS),  # gRPC would clamp it, loudly
            "initialBackoff": _duration(self.initial_backoff),
            "maxBackoff": _duration(self.max_backoff),
            "backoffMultiplier": self.multiplier,
            "retryableStatusCodes": sorted(code.name for code in self.retryable_codes),
        }


LOAD_BALANCING = "round_robin"
"""The gRPC load-balancing policy of the clients' service config: every call goes to the next
connected address of the target (several addresses, or a DNS name resolving to several)."""


def service_config(
    retry: RetryPolicy | None = None, *, load_balancing: str = LOAD_BALANCING
) -> dict[str, Any]:
    """The gRPC service config both clients pass to their channel (`grpc.service_config`).

    `loadBalancingConfig` is `load_balancing` (`round_robin`: calls spread over every address
    the target resolves to; `pick_first`: one connection). One `methodConfig` names the
    idempotent reads (`IDEMPOTENT_READS`) with `retry`'s `retryPolicy` (default
    `RetryPolicy()`); writes, streams and the health check are not named, so gRPC never retries
    them. It is plain JSON: `json.dumps(service_config())` is what a Node
    (`grpc.service_config` channel option), Go (`grpc.WithDefaultServiceConfig`) or Java
    (`defaultServiceConfig`) client reads to balance and retry the same calls the same way.
    """
    policy = RetryPolicy() if retry is None else retry
    names = [
        {"service": service, "method": name}
        for service, name in sorted(path[1:].split("/") for path in IDEMPOTENT_READS)
    ]
    config: dict[str, Any] = {"name": names}
    if policy.max_attempts > 1:
        config["retryPolicy"] = policy.as_service_config()
    return {"loadBalancingConfig": [{load_balancing: {}}], "methodConfig": [config]}


def channel_target(address: str | Sequence[str]) -> str:
    """The gRPC target of a client's `address`: a string is a target as gRPC reads it
    (`host:port`, `dns:///host:port`, `ipv4:…`, `unix:…`), returned as is; a list of one is
    that one; a list of several must be IP literals with ports (`127.0.0.1:50051`,
    `[::1]:50051`), all of one family, and becomes `ipv4:a:p,b:p,…` (or `ipv6:`), which gRPC
    balances over. Host names do not combine into one target: give one DNS name resolving to
    every replica instead (`dns:///satchel.internal:50051`).
    """
    if isinstance(address, str):
        return address
    addresses = list(address)
    if not addresses or not all(isinstance(a, str) and a for a in addresses):
        raise ValueError("address: a target string or a non-empty list of 'IP:port' strings")
    if len(addresses) == 1:
        return addresses[0]
    families = {_ip_family(a) for a in addresses}
    if len(families) > 1:
        raise ValueError(f"address: IPv4 and IPv6 addresses do not mix in one list: {addresses}")
    return f"{families.pop()}:{','.join(addresses)}"


def _ip_family(address: str) -> str:
    """`ipv4` or `ipv6` for an `IP:port` string (IPv6 in brackets), else ValueError."""
    host, sep, port = address.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        ip = ipaddress.ip_address(host) if sep and port.isdigit() else None
    except ValueError:
        ip = None
    if ip is None or (ip.version == 6 and not address.startswith("[")):
        raise ValueError(
            f"address: {address!r} is not 'IP:port' ('127.0.0.1:50051', '[::1]:50051'); "
            "for host names give one DNS name resolving to every replica, "
            "'dns:///satchel.internal:50051'"
        )
    return f"ipv{ip.version}"


def channel_options(
    retry: RetryPolicy | None, options: Sequence[tuple[str, Any]] = ()
) -> list[tuple[str, Any]]:
    """The channel options of a client: retries on, and `service_config(retry)` unless the
    caller's `options` already carry a `grpc.service_config` of their own."""
    given = list(options)
    keys = {key for key, _ in given}
    extra: list[tuple[str, Any]] = []
    if "grpc.enable_retries" not in keys:
        extra.append(("grpc.enable_retries", 1))
    if "grpc.service_config" not in keys:
        extra.append(("grpc.service_config", json.dumps(service_config(retry))))
    return [*extra, *given]


def _duration(seconds: float) -> str:
    """A protobuf JSON Duration (`"0.1s"`), as service configs spell them."""
    return f"{seconds:.9f}".rstrip("0").rstrip(".") + "s"


def call_metadata(api_key: str | None, extra: Metadata = ()) -> tuple[tuple[str, str], ...]:
    """The metadata of every call: `authorization: Bearer <api_key>` when a key is set."""
    items = [("authorization", f"Bearer {api_key}")] if api_key else []
    return (*items, *extra)


def method(service: str, name: str) -> str:
    """The full gRPC method path, e.g. `/satchel.v1.ContextService/GetTrace`."""
    return f"/{service}/{name}"
