"""`satchel watch` prints one line per message that fits the terminal's width."""

from __future__ import annotations

import pytest

from satchel.server.commands.context_cmds import _watch_line
from satchel.v1 import context_pb2 as pb

DECISION = pb.WatchTracesResponse(
    trace_id="0f3c2a9e-1111-2222-3333-444455556666",
    subject_id="a-rather-long-subject-id",
    decision=pb.Decision(
        sequence=12,
        candidate_kind=pb.CANDIDATE_KIND_EPISODE,
        outcome=pb.DECISION_OUTCOME_EXCLUDED,
        reason_code="source_already_served",
        score=0.4321,
        budget_used=812,
        preview="Caroline: I went to the LGBTQ support group yesterday and it was so powerful " * 3,
    ),
)
PACKET = pb.WatchTracesResponse(
    trace_id=DECISION.trace_id,
    subject_id="user-1",
    packet=pb.ContextPacket(budget_tokens=900, tokens_used=886, warnings=["a", "b"]),
)


@pytest.mark.parametrize("width", [40, 80, 150, 250])
def test_every_line_fits_the_width(width: int) -> None:
    for message in (DECISION, PACKET):
        line = _watch_line(message, width)
        assert "\n" not in line.plain and line.cell_len <= width, (width, line.plain)


def test_a_wide_terminal_shows_more_of_the_preview() -> None:
    narrow, wide = _watch_line(DECISION, 120).plain, _watch_line(DECISION, 250).plain
    assert "Caroline" in narrow and len(wide) > len(narrow)
