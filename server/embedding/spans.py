"""Where the parts of a text sit in it, for pooling their vectors (`port.SpanPooler`)."""

from __future__ import annotations

from collections.abc import Sequence


def part_spans(text: str, parts: Sequence[str], offset: int = 0) -> list[tuple[int, int]] | None:
    """The (start, end) characters of each part in `text`, found in order and moved by
    `offset` (a prompt put in front of the text); None when a part is not found."""
    spans, cursor = [], 0
    for part in parts:
        start = text.find(part, cursor)
        if start < 0:
            return None
        spans.append((offset + start, offset + start + len(part)))
        cursor = start + len(part)
    return spans
