"""What the client commands share: server address, SDK client, JSON output, errors."""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import UTC, datetime
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import Message

from satchel.client import DEFAULT_ADDRESS, DEFAULT_TIMEOUT, SatchelClient, SatchelError


def default_address() -> str:
    """SATCHEL_ADDRESS, else SATCHEL_LISTEN, else 127.0.0.1:50051."""
    return os.environ.get("SATCHEL_ADDRESS") or os.environ.get("SATCHEL_LISTEN") or DEFAULT_ADDRESS


def dialable(address: str) -> str:
    """A listen address a client can dial: a wildcard host means the loopback."""
    host, _, port = address.rpartition(":")
    return f"{'127.0.0.1' if host in ('0.0.0.0', '', '[::]') else host}:{port}"


def server_address(args: argparse.Namespace) -> str:
    """--address, else the default address (see `default_address`)."""
    return dialable(getattr(args, "address", None) or default_address())


def add_client_options(
    parser: argparse.ArgumentParser, *, json_help: str = "", timeout: float = DEFAULT_TIMEOUT
) -> None:
    """--address, --api-key, --timeout, and --json when `json_help` is given."""
    parser.add_argument(
        "--address",
        help="server host:port (default: SATCHEL_ADDRESS, else SATCHEL_LISTEN, else "
        f"{DEFAULT_ADDRESS})",
    )
    parser.add_argument(
        "--api-key",
        default=os.environ.get("SATCHEL_API_KEY"),
        help="sent as 'authorization: Bearer KEY' (default: SATCHEL_API_KEY)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=timeout,
        help=f"deadline of each call in seconds (default {timeout:g})",
    )
    if json_help:
        parser.add_argument("--json", action="store_true", help=json_help)


def client(args: argparse.Namespace, address: str | None = None) -> SatchelClient:
    """An SDK client for the command's server and options."""
    return SatchelClient(
        address or server_address(args),
        api_key=getattr(args, "api_key", None),
        timeout=getattr(args, "timeout", DEFAULT_TIMEOUT),
    )


def as_dict(message: Message) -> dict[str, Any]:
    """A message as JSON-ready data: proto field names, every field present."""
    return json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )


def print_json(message: Message | dict[str, Any]) -> None:
    """One indented JSON document on stdout."""
    data = message if isinstance(message, dict) else as_dict(message)
    print(json.dumps(data, indent=2, ensure_ascii=False))


def print_json_line(message: Message | dict[str, Any]) -> None:
    """One JSON line on stdout (for streams), flushed at once."""
    data = message if isinstance(message, dict) else as_dict(message)
    print(json.dumps(data, ensure_ascii=False, separators=(",", ":")), flush=True)


def fail(error: SatchelError, address: str = "") -> int:
    """Report a failed call on stderr; exit code 1."""
    where = f" ({address})" if address and error.code.name == "UNAVAILABLE" else ""
    print(f"satchel: {error}{where}", file=sys.stderr)
    return 1


def parse_instant(text: str) -> datetime:
    """An ISO 8601 date or datetime for --as-of; naive means UTC."""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an ISO 8601 date or datetime: {text!r}") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)
