"""Request validation shared by the servicers: each check adds a field violation.

The documented limits live here (docs/operations.md, "Limits"); the servicers collect every
violation of a request and raise them together as INVALID_ARGUMENT with google.rpc.BadRequest.
"""

from __future__ import annotations

import json
import math
import re
import unicodedata
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from google.protobuf import duration_pb2, struct_pb2, timestamp_pb2
from google.protobuf.message import Message

from satchel.server.platform.errors import Violations
from satchel.server.platform.storage.replicas import TOKEN

MAX_ID_CHARS = 200
MAX_QUERY_CHARS = 8_000
MAX_TEXT_CHARS = 32_000
MAX_BUDGET_TOKENS = 100_000


def has_control_chars(text: str) -> bool:
    """True when text holds control characters other than tab, newline and carriage return."""
    return any(unicodedata.category(ch) in ("Cc", "Cs") and ch not in "\t\n\r" for ch in text)


def check_id(violations: Violations, field: str, value: str, *, required: bool = True) -> None:
    """A caller-chosen identifier (project, subject, talent…): non-empty, short, printable."""
    if not value:
        if required:
            violations.add(field, "must not be empty")
        return
    if len(value) > MAX_ID_CHARS:
        violations.add(field, f"must be at most {MAX_ID_CHARS} characters")
    elif value != value.strip() or has_control_chars(value):
        violations.add(field, "must not have surrounding spaces or control characters")


def check_text(
    violations: Violations, field: str, value: str, *, max_chars: int, required: bool = False
) -> None:
    """Free text: bounded length, no control characters."""
    if not value.strip():
        if required:
            violations.add(field, "must not be empty")
        return
    if len(value) > max_chars:
        violations.add(field, f"must be at most {max_chars} characters")
    elif has_control_chars(value):
        violations.add(field, "must not contain control characters")


def parse_uuid(violations: Violations, field: str, value: str) -> uuid.UUID | None:
    """A server-assigned id (fact, event, trace, conflict): a UUID string."""
    if not value:
        violations.add(field, "must not be empty")
        return None
    try:
        return uuid.UUID(value)
    except ValueError:
        violations.add(field, "must be a UUID")
        return None


# --- Memory write path (issue 3) -------------------------------------------------------------

MAX_PAYLOAD_BYTES = 64 * 1024
"""Serialized size limit of an event payload or a fact value (google.protobuf Struct/Value)."""

DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000
"""List pages: `page_size` 0 means the default; larger values are lowered to the maximum."""

MAX_BATCH_ITEMS = 1000
"""Items of one BatchRecordEvents / BatchAssertFacts request."""

MAX_REFERENCED_IDS = 256
"""Ids in one repeated reference field (source_event_ids, supersedes_fact_ids, fact_ids)."""

# google.protobuf.Timestamp's range: 0001-01-01T00:00:00Z .. 9999-12-31T23:59:59.999999999Z.
_MIN_TIMESTAMP_SECONDS = -62_135_596_800
_MAX_TIMESTAMP_SECONDS = 253_402_300_799
# google.protobuf.Duration's range: +-10,000 years.
_MAX_DURATION_SECONDS = 315_576_000_000

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def join_key(path: str, key: str) -> str:
    """The field path of a JSON object member: `payload.text`, `value["a b"]`."""
    if _IDENTIFIER.fullmatch(key):
        return f"{path}.{key}" if path else key
    return f"{path}[{json.dumps(key, ensure_ascii=False)}]"


def check_timestamp(
    violations: Violations, field: str, message: timestamp_pb2.Timestamp, *, present: bool
) -> datetime | None:
    """A Timestamp within its documented range, as an aware UTC datetime (None when absent).

    PostgreSQL keeps microseconds: nanoseconds beyond are truncated.
    """
    if not present:
        return None
    if not _MIN_TIMESTAMP_SECONDS <= message.seconds <= _MAX_TIMESTAMP_SECONDS:
        violations.add(field, "must be between 0001-01-01 and 9999-12-31")
        return None
    if not 0 <= message.nanos <= 999_999_999:
        violations.add(field, "nanos must be in [0, 999999999]")
        return None
    return message.ToDatetime(tzinfo=UTC)


def check_duration(
    violations: Violations, field: str, message: duration_pb2.Duration, *, present: bool
) -> timedelta | None:
    """A non-negative Duration within its documented range (None when absent)."""
    if not present:
        return None
    seconds, nanos = message.seconds, message.nanos
    if abs(seconds) > _MAX_DURATION_SECONDS or not -999_999_999 <= nanos <= 999_999_999:
        violations.add(field, "is out of the range of google.protobuf.Duration")
        return None
    if (seconds > 0 and nanos < 0) or (seconds < 0 and nanos > 0):
        violations.add(field, "seconds and nanos must have the same sign")
        return None
    if seconds < 0 or nanos < 0:
        violations.add(field, "must not be negative")
        return None
    return timedelta(seconds=seconds, microseconds=nanos // 1000)


def _json_number(violations: Violations, field: str, number: float) -> float | int | None:
    if not math.isfinite(number):
        violations.add(field, "must be a finite number (JSON has no NaN or Infinity)")
        return None
    if number.is_integer() and abs(number) < 2**53:
        return int(number)
    return number


def _json_string(violations: Violations, field: str, text: str) -> str:
    if has_control_chars(text):
        violations.add(field, "must not contain control characters")
    return text


def json_from_value(violations: Violations, field: str, value: struct_pb2.Value) -> object:
    """A google.protobuf.Value as plain JSON data, checking every string and number.

    Strings (object keys included) must hold no control characters other than tab, newline
    and carriage return; numbers must be finite. Integral numbers become ints (`30`, not `30.0`).
    """
    kind = value.WhichOneof("kind")
    if kind is None:
        violations.add(field, "must be set (null, number, string, bool, struct or list)")
        return None
    if kind == "null_value":
        return None
    if kind == "number_value":
        return _json_number(violations, field, value.number_value)
    if kind == "string_value":
        return _json_string(violations, field, value.string_value)
    if kind == "bool_value":
        return value.bool_value
    if kind == "struct_value":
        return json_from_struct(violations, field, value.struct_value)
    return [
        json_from_value(violations, f"{field}[{index}]", item)
        for index, item in enumerate(value.list_value.values)
    ]


def json_from_struct(
    violations: Violations, field: str, struct: struct_pb2.Struct
) -> dict[str, object]:
    """A google.protobuf.Struct as a dict, checked like `json_from_value`."""
    out: dict[str, object] = {}
    for key in sorted(struct.fields):
        path = join_key(field, key)
        _json_string(violations, path, key)
        out[key] = json_from_value(violations, path, struct.fields[key])
    return out


def check_json_size(violations: Violations, field: str, message: Message) -> bool:
    """True when a payload/value is within MAX_PAYLOAD_BYTES once serialized."""
    size = message.ByteSize()
    if size > MAX_PAYLOAD_BYTES:
        violations.add(
            field, f"must be at most {MAX_PAYLOAD_BYTES} bytes serialized (is {size} bytes)"
        )
        return False
    return True


def check_page_size(violations: Violations, field: str, size: int) -> int:
    """`page_size`: 0 means DEFAULT_PAGE_SIZE, larger than MAX_PAGE_SIZE means the maximum."""
    if size < 0:
        violations.add(field, "must not be negative")
        return DEFAULT_PAGE_SIZE
    return min(size or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)


def parse_uuids(
    violations: Violations, field: str, values: Sequence[str], *, max_count: int
) -> list[uuid.UUID]:
    """A repeated server-assigned id field: each a UUID, duplicates dropped (first kept)."""
    if len(values) > max_count:
        violations.add(field, f"must hold at most {max_count} ids")
        return []
    out: dict[uuid.UUID, None] = {}
    for index, value in enumerate(values):
        parsed = parse_uuid(violations, f"{field}[{index}]", value)
        if parsed is not None:
            out.setdefault(parsed)
    return list(out)


def check_consistency_token(violations: Violations, field: str, token: str) -> str:
    """A write's consistency token, or "" (none); anything else is a violation."""
    if token and not TOKEN.fullmatch(token):
        violations.add(field, "must be a consistency_token returned by a write, or empty")
    return token
