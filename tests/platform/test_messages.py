"""JSON values and instants as the protobuf well-known types, as protobuf's own code builds
them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from google.protobuf import json_format, struct_pb2, timestamp_pb2

from satchel.server.platform.api.messages import timestamp_message, value_message

VALUES = [
    None,
    True,
    0,
    -3,
    2.5,
    10**20,
    "",
    "Lisbon",
    [],
    {},
    {"amount": 3000, "currency": "EUR", "tags": ["a", {"nested": None}], "ok": False},
    [1, "two", None, [3.0], {}],
]


@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_a_value_is_what_json_format_builds(value: object) -> None:
    assert value_message(value) == json_format.ParseDict(value, struct_pb2.Value())


def test_anything_else_is_refused() -> None:
    with pytest.raises(TypeError, match="not a JSON value"):
        value_message(object())


INSTANTS = [
    datetime(2023, 5, 8, 13, 56, 12, 345678, tzinfo=UTC),
    datetime(1970, 1, 1, tzinfo=UTC),
    datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),  # before the epoch: nanos >= 0
    datetime(1960, 2, 29, 0, 0, 0, 1, tzinfo=UTC),
    datetime(2023, 5, 8, 13, 56, tzinfo=timezone(timedelta(hours=2))),
    datetime(2023, 5, 8, 13, 56, tzinfo=timezone(timedelta(hours=-9, minutes=-30))),
    datetime(2020, 1, 1, 1, 2, 3, 4),  # naive: UTC, as FromDatetime reads it
    datetime(1, 1, 1, tzinfo=UTC),
    datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
]


@pytest.mark.parametrize("instant", INSTANTS, ids=str)
def test_an_instant_is_what_from_datetime_builds(instant: datetime) -> None:
    expected = timestamp_pb2.Timestamp()
    expected.FromDatetime(instant)
    assert timestamp_message(instant) == expected


def test_no_instant_stays_unset() -> None:
    assert timestamp_message(None) is None
