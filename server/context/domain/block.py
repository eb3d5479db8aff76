"""The `<satchel_memory>` block an agent puts in its prompt, defined once. Pure: no I/O.

    <satchel_memory>
    Known facts:
    - Maya lives in Porto (valid from 2026-03-01, confidence 0.80)
    Relevant past episodes:
    - [2026-03-01 10:30] conversation.message: Maya: I moved to Porto!
    Notes:
    - open_conflict: 1 fact(s) hidden pending conflict resolution
    </satchel_memory>

Facts (their statement, else `predicate: value`; the validity date; a confidence below 1), then
episodes (date, kind, excerpt), then the packet's warnings, each on one line; nothing to say is
the empty string. The server renders it into every packet (`ContextPacket.block`) and, with
`SATCHEL_BUDGET_COUNTS=block`, packing charges each line's tokens against the budget
(`BlockCosts`): the block never holds more tokens than the budget. Notes are kept only when
they fit.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

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


def fact_line(
    statement: str, predicate: str, value: Any, valid_from: datetime | None, confidence: float
) -> str:
    """A fact's line: its statement (else `predicate: value`), validity date, confidence."""
    if statement.strip():
        text = statement
    else:
        shown = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        text = f"{predicate}: {shown}"
    notes = []
    if valid_from is not None:
        notes.append(f"valid from {_utc(valid_from):%Y-%m-%d}")
    if 0 < confidence < 1:
        notes.append(f"confidence {confidence:.2f}")
    suffix = f" ({', '.join(notes)})" if notes else ""
    return f"- {one_line(text)}{suffix}"


def episode_line(occurred_at: datetime | None, kind: str, excerpt: str) -> str:
    """An episode's line: when it occurred, its kind, its excerpt."""
    when = f"[{_utc(occurred_at):%Y-%m-%d %H:%M}] " if occurred_at is not None else ""
    prefix = f"{kind}: " if kind else ""
    return f"- {when}{prefix}{one_line(excerpt)}"


def warning_line(warning: str) -> str:
    return f"- {one_line(warning)}"


def render_block(
    fact_lines: Sequence[str],
    episode_lines: Sequence[str],
    warnings: Sequence[str],
    fits: Callable[[str], bool] | None = None,
) -> str:
    """The block of these lines; "" without a fact or an episode. The notes (warnings) are
    left out when the block with them does not `fits`."""
    if not fact_lines and not episode_lines:
        return ""
    body = [MEMORY_OPEN]
    if fact_lines:
        body += [FACTS_HEADER, *fact_lines]
    if episode_lines:
        body += [EPISODES_HEADER, *episode_lines]
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
