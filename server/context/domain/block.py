"""The `<satchel_memory>` block an agent puts in its prompt, defined once. Pure: no I/O.

Two layouts (SATCHEL_BLOCK_LAYOUT). `dated`, the default, says each date once: facts under the
day they became valid, episodes under their day and kind, each day's episodes in the order
they occurred:

    <satchel_memory>
    Known facts:
    - Maya is vegetarian (confidence 0.80)
    since 2026-03-01:
    - Maya lives in Porto
    Relevant past episodes:
    2026-03-01, conversation.message:
    - 10:30 Maya: I moved to Porto!
    Notes:
    - open_conflict: 1 fact(s) hidden pending conflict resolution
    </satchel_memory>

`lines`, the layout before it, repeats the date (and the kind) on every line, in the packet's
order:

    Known facts:
    - Maya lives in Porto (valid from 2026-03-01, confidence 0.80)
    Relevant past episodes:
    - [2026-03-01 10:30] conversation.message: Maya: I moved to Porto!

Facts without a date come first, under no date; a day's facts keep the packet's order. The
packet's warnings follow the items, one a line; nothing to say is the empty string. The server
renders it into every packet (`ContextPacket.block`) and, with `SATCHEL_BUDGET_COUNTS=block`,
packing charges each item's line, and the header of its group with the group's first item,
against the budget (`BlockCosts`): the block never holds more tokens than the budget. Notes are
kept only when they fit.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, Protocol

MEMORY_OPEN = "<satchel_memory>"
MEMORY_CLOSE = "</satchel_memory>"
FACTS_HEADER = "Known facts:"
EPISODES_HEADER = "Relevant past episodes:"
NOTES_HEADER = "Notes:"

_SPACES = re.compile(r"\s+")
_CLOSING_TAG = re.compile(r"</\s*satchel_memory\s*>", re.IGNORECASE)


class Counter(Protocol):
    """What `BlockCosts` needs of a token counter (`satchel.server.platform.tokens`)."""

    def bound(self, part: str) -> int: ...


def one_line(text: str) -> str:
    """Whitespace collapsed, and no closing tag that would end the block early."""
    return _CLOSING_TAG.sub("[/satchel_memory]", _SPACES.sub(" ", text).strip())


def _utc(instant: datetime) -> datetime:
    return instant.astimezone(UTC) if instant.tzinfo is not None else instant


DATED: Final = "dated"
LINES: Final = "lines"


@dataclass(frozen=True)
class Entry:
    """An item's place in the block: its `line`, the header of its `group` ("": none) and
    the `order` its group and line sort by (empty: the packet's order)."""

    line: str
    group: str = ""
    order: tuple[Any, ...] = ()


def _day(instant: datetime) -> str:
    return f"{_utc(instant):%Y-%m-%d}"


def fact_entry(
    statement: str,
    predicate: str,
    value: Any,
    valid_from: datetime | None,
    confidence: float,
    layout: str = DATED,
) -> Entry:
    """A fact's entry: its statement (else `predicate: value`), its confidence below 1, and
    the day it became valid (`dated`: its group; `lines`: on its line)."""
    if statement.strip():
        text = statement
    else:
        shown = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        text = f"{predicate}: {shown}"
    day = _day(valid_from) if valid_from is not None else ""
    grouped = bool(day) and layout == DATED
    notes = [f"valid from {day}"] if day and not grouped else []
    if 0 < confidence < 1:
        notes.append(f"confidence {confidence:.2f}")
    suffix = f" ({', '.join(notes)})" if notes else ""
    line = f"- {one_line(text)}{suffix}"
    return Entry(line, f"since {day}:", (day,)) if grouped else Entry(line)


def episode_entry(
    occurred_at: datetime | None, kind: str, excerpt: str, layout: str = DATED
) -> Entry:
    """An episode's entry: its excerpt, when it occurred and its kind (`dated`: its day and
    kind are its group, its time starts its line; `lines`: all on its line)."""
    if layout != DATED:
        when = f"[{_utc(occurred_at):%Y-%m-%d %H:%M}] " if occurred_at is not None else ""
        prefix = f"{kind}: " if kind else ""
        return Entry(f"- {when}{prefix}{one_line(excerpt)}")
    if occurred_at is None:
        return Entry(f"- {one_line(excerpt)}", f"{kind}:" if kind else "", ("", kind))
    at = _utc(occurred_at)
    group = f"{_day(at)}, {kind}:" if kind else f"{_day(at)}:"
    return Entry(f"- {at:%H:%M} {one_line(excerpt)}", group, (_day(at), kind, at))


def warning_line(warning: str) -> str:
    return f"- {one_line(warning)}"


def _section(header: str, entries: Sequence[Entry]) -> list[str]:
    """A section's lines: its header, then its entries; grouped ones after those without a
    group, by their `order` (each group's header before its first line)."""
    if not entries:
        return []
    loose = [e.line for e in entries if not e.group]
    grouped = sorted((e for e in entries if e.group), key=lambda e: e.order)
    lines, group = [header, *loose], ""
    for entry in grouped:
        if entry.group != group:
            lines.append(entry.group)
            group = entry.group
        lines.append(entry.line)
    return lines


def render_block(
    facts: Sequence[Entry],
    episodes: Sequence[Entry],
    warnings: Sequence[str],
    fits: Callable[[str], bool] | None = None,
) -> str:
    """The block of these entries; "" without a fact or an episode. The notes (warnings) are
    left out when the block with them does not `fits`."""
    if not facts and not episodes:
        return ""
    body = [
        MEMORY_OPEN,
        *_section(FACTS_HEADER, facts),
        *_section(EPISODES_HEADER, episodes),
    ]
    if warnings:
        noted = "\n".join([*body, NOTES_HEADER, *map(warning_line, warnings), MEMORY_CLOSE])
        if fits is None or fits(noted):
            return noted
    return "\n".join([*body, MEMORY_CLOSE])


@dataclass(frozen=True)
class BlockCosts:
    """What the block adds to its lines, charged by packing: the tags around it (with the
    first line served) and each section's header (with its first line)."""

    wrapper: int
    facts_header: int
    episodes_header: int

    @classmethod
    def of(cls, counter: Counter) -> BlockCosts:
        return cls(
            wrapper=counter.bound(MEMORY_OPEN) + counter.bound(MEMORY_CLOSE),
            facts_header=counter.bound(FACTS_HEADER),
            episodes_header=counter.bound(EPISODES_HEADER),
        )
