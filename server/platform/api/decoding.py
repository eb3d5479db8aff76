"""Request decoding that turns undecodable messages into INVALID_ARGUMENT, never INTERNAL.

grpcio answers INTERNAL ("Exception deserializing request!") when a request does not parse. The
interceptor wraps every request deserializer with `tolerant_deserializer`: a message that fails
to parse becomes an `UndecodableRequest`, and the interceptor raises `InvalidArgument` naming
what is wrong, found by walking the wire format against the message descriptor:

- a proto3 `string` holding bytes that are not UTF-8 (the common cause): each such field's path;
- messages nested deeper than protobuf's limit (`MAX_MESSAGE_DEPTH`, 100 levels: a Struct holds
  three per level of its JSON, so about 33 levels of JSON): the field holding them;
- anything else: the request as a whole.

Explaining costs O(size) time and memory whatever the bytes: the walk reads views of the
request (never copies of the rest at each level), stops at the depth limit, and reports at most
`MAX_REPORTED` fields with paths of at most `MAX_PATH_CHARS`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError

from satchel.server.platform.api.validation import join_key
from satchel.server.platform.errors import InvalidArgument

_STRUCT = "google.protobuf.Struct"
_VALUE = "google.protobuf.Value"
_LIST_VALUE = "google.protobuf.ListValue"
MAX_MESSAGE_DEPTH = 100  # upb's default decode limit: deeper requests never parse
MAX_REPORTED = 20
MAX_PATH_CHARS = 200
_KEY_CHARS = 40


class _Malformed(Exception):
    """The bytes are not a well-formed protobuf message."""


@dataclass(frozen=True)
class UndecodableRequest:
    """A request whose bytes did not parse; `error()` explains which fields are at fault."""

    descriptor: Descriptor | None
    data: bytes

    def error(self) -> InvalidArgument:
        """INVALID_ARGUMENT with a violation per field at fault (or the whole request)."""
        walk = _Walk()
        if self.descriptor is not None:
            try:
                walk.message(self.descriptor, memoryview(self.data), "", 1)
            except _Malformed:
                walk = _Walk()
        if walk.too_deep:
            limit = f"nests messages deeper than {MAX_MESSAGE_DEPTH} levels"
            return InvalidArgument(
                [(path, limit) for path in walk.too_deep], reason="NESTED_TOO_DEEP"
            )
        if walk.not_utf8:
            return InvalidArgument(
                [(path, "must be valid UTF-8") for path in walk.not_utf8], reason="INVALID_UTF8"
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


def _varint(data: memoryview, pos: int) -> tuple[int, int]:
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


def _fields(data: memoryview) -> Iterator[tuple[int, memoryview]]:
    """The (field number, bytes) of a message's length-delimited fields, as views of `data`."""
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
            yield number, data[pos : pos + length]
            pos += length
            continue
        else:  # groups (deprecated) or garbage
            raise _Malformed
        if pos > len(data):
            raise _Malformed


def _map_entry(data: memoryview) -> tuple[memoryview, memoryview]:
    key = value = memoryview(b"")
    for number, chunk in _fields(data):
        if number == 1:
            key = chunk
        elif number == 2:
            value = chunk
    return key, value


def _text(chunk: memoryview) -> str | None:
    """The chunk as UTF-8 text, None when it is not UTF-8."""
    try:
        return str(chunk, "utf-8")
    except UnicodeDecodeError:
        return None


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _key(path: str, key: str) -> str:
    return join_key(path, key if len(key) <= _KEY_CHARS else key[:_KEY_CHARS] + "…")


def _bounded(path: str) -> str:
    path = path or "request"
    return path if len(path) <= MAX_PATH_CHARS else path[:MAX_PATH_CHARS] + "…"


def _message_type(field: FieldDescriptor) -> Descriptor:
    """The message type of a message field (a map entry's too), which always has one."""
    if field.message_type is None:
        raise TypeError(f"{field.full_name} is not a message field")
    return field.message_type


class _Walk:
    """What one walk of a request found: non-UTF-8 string fields and over-deep fields."""

    def __init__(self) -> None:
        self.not_utf8: list[str] = []
        self.too_deep: list[str] = []

    def _full(self) -> bool:
        return len(self.not_utf8) + len(self.too_deep) >= MAX_REPORTED

    def _bad(self, path: str) -> None:
        if not self._full():
            self.not_utf8.append(_bounded(path))

    def message(self, descriptor: Descriptor, data: memoryview, path: str, depth: int) -> None:
        """Walk the message `data` of type `descriptor` found at `path`, `depth` levels down."""
        if depth > MAX_MESSAGE_DEPTH:
            if not self._full():
                self.too_deep.append(_bounded(path))
            return
        seen: dict[int, int] = {}
        full_name = descriptor.full_name
        for number, chunk in _fields(data):
            if self._full():
                return
            field = descriptor.fields_by_number.get(number)
            if field is None:
                continue
            index = seen.get(number, 0)
            seen[number] = index + 1
            if full_name == _STRUCT and field.name == "fields":
                key, value = _map_entry(chunk)
                name = _text(key)
                if name is None:
                    self._bad(path)
                    continue
                value_type = _message_type(_message_type(field).fields_by_name["value"])
                self.message(value_type, value, _key(path, name), depth + 2)
                continue
            if full_name == _VALUE:
                child = path
            elif full_name == _LIST_VALUE:
                child = f"{path}[{index}]"
            elif field.message_type is not None and field.message_type.GetOptions().map_entry:
                key, value = _map_entry(chunk)
                name = _text(key)
                if name is None:
                    self._bad(_join(path, field.name))
                    continue
                child = f"{_join(path, field.name)}[{name[:_KEY_CHARS]!r}]"
                value_field = field.message_type.fields_by_name["value"]
                if value_field.type == FieldDescriptor.TYPE_STRING:
                    if _text(value) is None:
                        self._bad(child)
                elif value_field.type == FieldDescriptor.TYPE_MESSAGE:
                    self.message(_message_type(value_field), value, child, depth + 2)
                continue
            else:
                child = _join(path, field.name)
                if field.is_repeated:
                    child = f"{child}[{index}]"
            if field.type == FieldDescriptor.TYPE_STRING:
                if _text(chunk) is None:
                    self._bad(child)
            elif field.type == FieldDescriptor.TYPE_MESSAGE:
                self.message(_message_type(field), chunk, child, depth + 1)


def invalid_utf8_paths(descriptor: Descriptor, data: bytes) -> list[str]:
    """Field paths (`requests[2].payload.text`) of string fields whose bytes are not UTF-8."""
    walk = _Walk()
    walk.message(descriptor, memoryview(data), "", 1)
    return walk.not_utf8
