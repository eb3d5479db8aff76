"""Request decoding that turns undecodable messages into INVALID_ARGUMENT, never INTERNAL.

grpcio answers INTERNAL ("Exception deserializing request!") when a request does not parse;
a proto3 `string` holding bytes that are not UTF-8 is the common cause. The interceptor wraps
every request deserializer with `tolerant_deserializer`: a message that fails to parse becomes
an `UndecodableRequest`, and the interceptor raises `InvalidArgument` naming the fields whose
bytes are not UTF-8 (found by walking the wire format against the message descriptor).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError

from satchel.server.api.validation import join_key
from satchel.server.errors import InvalidArgument

_STRUCT = "google.protobuf.Struct"
_VALUE = "google.protobuf.Value"
_LIST_VALUE = "google.protobuf.ListValue"


class _Malformed(Exception):
    """The bytes are not a well-formed protobuf message."""


@dataclass(frozen=True)
class UndecodableRequest:
    """A request whose bytes did not parse; `error()` explains which fields are at fault."""

    descriptor: Descriptor | None
    data: bytes

    def error(self) -> InvalidArgument:
        """INVALID_ARGUMENT with a field violation per non-UTF-8 string (or the whole request)."""
        paths: list[str] = []
        if self.descriptor is not None:
            try:
                paths = invalid_utf8_paths(self.descriptor, self.data)
            except _Malformed:
                paths = []
        if paths:
            return InvalidArgument(
                [(path, "must be valid UTF-8") for path in paths], reason="INVALID_UTF8"
            )
        return InvalidArgument(
            [("request", "is not a well-formed protobuf message of the expected type")],
            reason="MALFORMED_REQUEST",
        )


def tolerant_deserializer(
    deserializer: Callable[[bytes], Any],
) -> Callable[[bytes], Any]:
    """Wrap `Message.FromString`: a parse failure returns an `UndecodableRequest`."""
    message_class = getattr(deserializer, "__self__", None)
    found = getattr(message_class, "DESCRIPTOR", None)
    descriptor = found if isinstance(found, Descriptor) else None

    def deserialize(data: bytes) -> Any:
        try:
            return deserializer(data)
        except DecodeError:
            return UndecodableRequest(descriptor, data)

    return deserialize


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise _Malformed
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def _fields(data: bytes) -> list[tuple[int, int, bytes]]:
    """The (field number, wire type, bytes) of a message; bytes only for length-delimited."""
    out: list[tuple[int, int, bytes]] = []
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            _, pos = _varint(data, pos)
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        elif wire == 2:
            length, pos = _varint(data, pos)
            if pos + length > len(data):
                raise _Malformed
            out.append((number, wire, data[pos : pos + length]))
            pos += length
            continue
        else:  # groups (deprecated) or garbage
            raise _Malformed
        if pos > len(data):
            raise _Malformed
    return out


def _map_entry(data: bytes) -> tuple[bytes, bytes]:
    key = value = b""
    for number, _, chunk in _fields(data):
        if number == 1:
            key = chunk
        elif number == 2:
            value = chunk
    return key, value


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def invalid_utf8_paths(descriptor: Descriptor, data: bytes, path: str = "") -> list[str]:
    """Field paths (`requests[2].payload.text`) of string fields whose bytes are not UTF-8."""
    bad: list[str] = []
    seen: dict[int, int] = {}
    full_name = descriptor.full_name
    for number, _, chunk in _fields(data):
        field = descriptor.fields_by_number.get(number)
        if field is None:
            continue
        index = seen.get(number, 0)
        seen[number] = index + 1
        if full_name == _STRUCT and field.name == "fields":
            key, value = _map_entry(chunk)
            try:
                name = key.decode("utf-8")
            except UnicodeDecodeError:
                bad.append(path or "request")
                continue
            bad.extend(
                invalid_utf8_paths(
                    field.message_type.fields_by_name["value"].message_type,
                    value,
                    join_key(path, name),
                )
            )
            continue
        if full_name == _VALUE:
            child = path
        elif full_name == _LIST_VALUE:
            child = f"{path}[{index}]"
        elif field.message_type is not None and field.message_type.GetOptions().map_entry:
            key, value = _map_entry(chunk)
            try:
                child = f"{_join(path, field.name)}[{key.decode('utf-8')!r}]"
            except UnicodeDecodeError:
                bad.append(_join(path, field.name))
                continue
            value_field = field.message_type.fields_by_name["value"]
            if value_field.type == FieldDescriptor.TYPE_STRING:
                try:
                    value.decode("utf-8")
                except UnicodeDecodeError:
                    bad.append(child)
            elif value_field.type == FieldDescriptor.TYPE_MESSAGE:
                bad.extend(invalid_utf8_paths(value_field.message_type, value, child))
            continue
        else:
            child = _join(path, field.name)
            if field.is_repeated:
                child = f"{child}[{index}]"
        if field.type == FieldDescriptor.TYPE_STRING:
            try:
                chunk.decode("utf-8")
            except UnicodeDecodeError:
                bad.append(child or "request")
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            bad.extend(invalid_utf8_paths(field.message_type, chunk, child))
    return bad
