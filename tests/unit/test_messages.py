"""JSON values as google.protobuf.Value, as protobuf's own JSON mapping builds them."""

from __future__ import annotations

import pytest
from google.protobuf import json_format, struct_pb2

from satchel.server.api.messages import value_message

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
