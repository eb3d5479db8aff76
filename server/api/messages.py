"""Conversions from Python values to the protobuf well-known types the servicers return."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from google.protobuf import json_format, struct_pb2, timestamp_pb2


def timestamp_message(value: datetime | None) -> timestamp_pb2.Timestamp | None:
    """A datetime as a Timestamp (None stays unset)."""
    if value is None:
        return None
    stamp = timestamp_pb2.Timestamp()
    stamp.FromDatetime(value)
    return stamp


def value_message(value: Any) -> struct_pb2.Value:
    """A JSON-like value as a google.protobuf.Value."""
    return json_format.ParseDict(value, struct_pb2.Value())
