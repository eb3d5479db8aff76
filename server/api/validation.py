"""Request validation shared by the servicers: each check adds a field violation.

The documented limits live here (README, "Limits"); the servicers collect every violation of
a request and raise them together as INVALID_ARGUMENT with google.rpc.BadRequest.
"""

from __future__ import annotations

import unicodedata
import uuid

from satchel.server.errors import Violations

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
