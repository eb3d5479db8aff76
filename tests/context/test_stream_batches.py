"""StreamContext's message boundaries: which decisions travel together."""

from __future__ import annotations

from collections.abc import AsyncIterator

from satchel.server.context.api import stream_messages
from satchel.server.context.domain.packing import (
    BELOW_RELEVANCE_FLOOR,
    EXCLUDED,
    FACT,
    Candidate,
    Decision,
)
from satchel.server.context.service import PASS_END, Packet, PassEnd


def _decision(sequence: int) -> Decision:
    candidate = Candidate(
        id=f"f{sequence}",
        kind=FACT,
        text="t",
        similarity=0.5,
        text_rank=0.0,
        recency=0.0,
        score=0.5,
    )
    return Decision(sequence, candidate, EXCLUDED, BELOW_RELEVANCE_FLOOR, 0)


PACKET = Packet("t-1", [], [], [], "ok", "", 900, 0)


async def _items(*items: Decision | PassEnd | Packet) -> AsyncIterator[Decision | PassEnd | Packet]:
    for item in items:
        yield item


async def _shape(per_message: int, *items: Decision | PassEnd | Packet) -> list[object]:
    """Each message as the list of its decision sequences, or "packet"."""
    shape: list[object] = []
    async for message in stream_messages(_items(*items), "t-1", per_message):
        kind = message.WhichOneof("event")
        if kind == "decisions":
            shape.append([d.sequence for d in message.decisions.decisions])
        elif kind == "decision":
            shape.append(message.decision.sequence)
        else:
            shape.append(kind)
    return shape


async def test_batches_hold_the_first_alone_then_fill_until_their_pass_ends() -> None:
    first_pass = [_decision(i) for i in range(1, 6)]
    hop_pass = [_decision(6)]
    shape = await _shape(3, *first_pass, PASS_END, *hop_pass, PASS_END, PACKET)
    assert shape == [[1], [2, 3, 4], [5], [6], "packet"]


async def test_zero_or_one_sends_each_decision_alone_as_before() -> None:
    items = [_decision(1), _decision(2), PASS_END, _decision(3), PASS_END, PACKET]
    for per_message in (0, 1):
        assert await _shape(per_message, *items) == [1, 2, 3, "packet"]


async def test_a_pass_of_nothing_sends_no_empty_batch() -> None:
    shape = await _shape(4, _decision(1), _decision(2), PASS_END, PASS_END, PACKET)
    assert shape == [[1], [2], "packet"]
