"""Text renderings of facts and events: what is embedded, budgeted and served.

Pure and deterministic: the same value always renders to the same text, whatever the key order
it was stored with (PostgreSQL `jsonb` does not keep insertion order).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

TEXT_KEYS: tuple[str, ...] = ("text", "content", "message", "body")
"""Payload keys holding the main text of an event, by priority."""

SPEAKER_KEYS: tuple[str, ...] = ("speaker", "author", "sender", "name", "role")
"""Payload keys naming who said the main text, by priority (used only with a text key)."""

ELLIPSIS = "…"

_PREDICATE_SEPARATORS = re.compile(r"[\s._-]+")


def _compact_json(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"))


def _value_text(value: object) -> str:
    """A JSON value as compact text: strings unquoted, anything else compact JSON."""
    return value if isinstance(value, str) else _compact_json(value)


def _scalar(value: object) -> str:
    """Like `_value_text`, but `None` reads "none" in a sentence."""
    return "none" if value is None else _value_text(value)


def derive_statement(predicate: str, value: object) -> str:
    """A short readable sentence for a fact.

    `("invoice_language", {"language": "fr"})` -> `"invoice language: language = fr"`.
    Dict keys are sorted; list items are joined with ", "; nested containers are compact JSON;
    `None` reads "none", booleans "true"/"false", an empty string `""`.
    """
    subject = _PREDICATE_SEPARATORS.sub(" ", predicate).strip()
    if isinstance(value, Mapping):
        if value:
            rendered = ", ".join(f"{key} = {_scalar(value[key])}" for key in sorted(value))
        else:
            rendered = "{}"
    elif isinstance(value, list | tuple):
        rendered = ", ".join(_scalar(item) for item in value) if value else "[]"
    elif value == "":
        rendered = '""'
    else:
        rendered = _scalar(value)
    return f"{subject}: {rendered}" if subject else rendered


def _first_string(payload: Mapping[str, object], keys: tuple[str, ...]) -> str | None:
    for key in keys:
        value = payload.get(key)
        if isinstance(value, str) and value.strip():
            return key
    return None


def render_event_text(kind: str, payload: Mapping[str, object]) -> str:
    """The text of an event, embedded at write time and served as the episode excerpt.

    With a text key (`text`, `content`, `message`, `body`, first non-empty string wins):
    `"{speaker}: {text} k=v ..."`, the speaker taken from `speaker`/`author`/`sender`/`name`/
    `role` when present. Without one: `"{kind} k=v ..."`. Remaining keys are sorted, strings
    unquoted, other values compact JSON; non-ASCII is kept as is.
    """
    remaining = dict(payload)
    parts: list[str] = []
    text_key = _first_string(remaining, TEXT_KEYS)
    if text_key is not None:
        text = str(remaining.pop(text_key))
        speaker_key = _first_string(remaining, SPEAKER_KEYS)
        if speaker_key is not None:
            parts.append(f"{str(remaining.pop(speaker_key)).strip()}: {text}")
        else:
            parts.append(text)
    elif kind:
        parts.append(kind)
    parts.extend(f"{key}={_value_text(remaining[key])}" for key in sorted(remaining))
    return " ".join(parts)


def excerpt(text: str, max_chars: int = 600) -> str:
    """`text` cut to at most `max_chars` characters on a word boundary, ending with "…"."""
    if max_chars < 1:
        raise ValueError("max_chars must be at least 1")
    if len(text) <= max_chars:
        return text
    limit = max_chars - len(ELLIPSIS)
    head = text[:limit]
    if not text[limit].isspace():
        boundary = next((i for i in range(limit - 1, 0, -1) if head[i].isspace()), 0)
        if boundary:
            head = head[:boundary]
    return head.rstrip() + ELLIPSIS
