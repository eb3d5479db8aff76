"""Conversions from Python values to the protobuf well-known types the servicers return."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from google.protobuf import struct_pb2, timestamp_pb2

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def timestamp_message(value: datetime | None) -> timestamp_pb2.Timestamp | None:
    """A datetime as a Timestamp (None stays unset; a naive one is UTC, as `FromDatetime`
    reads it). Exact integer arithmetic, ~10x cheaper than protobuf's `FromDatetime`, which
    runs in Python, a few dozen times a context call."""
    if value is None:
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    since = value - _EPOCH
    return timestamp_pb2.Timestamp(
        seconds=since.days * 86400 + since.seconds, nanos=since.microseconds * 1000
    )


def value_message(value: Any) -> struct_pb2.Value:
    """A JSON value (as `json.loads` returns it) as a google.protobuf.Value.

    Built with the message's own setters (`Struct.update`, `ListValue.extend`), which run in the
    protobuf runtime; `json_format.ParseDict` walks the value in Python, ~30 µs a fact served.
    """
    message = struct_pb2.Value()
    if value is None:
        message.null_value = struct_pb2.NULL_VALUE
    elif isinstance(value, bool):
        message.bool_value = value
    elif isinstance(value, int | float):
        message.number_value = value
    elif isinstance(value, str):
        message.string_value = value
    elif isinstance(value, dict):
        message.struct_value.SetInParent()  # an empty object is still an object
        message.struct_value.update(value)
    elif isinstance(value, list):
        message.list_value.SetInParent()
        message.list_value.extend(value)
    else:
        raise TypeError(f"not a JSON value: {type(value).__name__}")
    return message
