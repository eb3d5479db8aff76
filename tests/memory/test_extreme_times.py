"""Every timestamp the API accepts (0001-01-01 to 9999-12-31) works in every context call: as a
fact's validity, an event's time, and a call's `as_of` (issue: recency's exp() underflowed for
anything older than ~61 years, breaking every call of the scope for good)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import grpc
from google.protobuf import duration_pb2
from helpers.memory import event_request, fact_request
from helpers.memory import stub as memory_stub
from test_context import context_stub, ts

from satchel.v1 import context_pb2 as pb

FIRST = datetime(1, 1, 1, tzinfo=UTC)
LAST = datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)
DAY = timedelta(days=1)


async def _call(channel: grpc.aio.Channel, project_id: str, query: str, **fields):
    assembled = await context_stub(channel).AssembleContext(
        pb.AssembleContextRequest(project_id=project_id, subject_id="user-1", query=query, **fields)
    )
    streamed = [
        m
        async for m in context_stub(channel).StreamContext(
            pb.StreamContextRequest(
                project_id=project_id, subject_id="user-1", query=query, **fields
            )
        )
    ]
    assert streamed[-1].packet.facts == assembled.packet.facts
    return assembled.packet


async def test_the_oldest_and_newest_timestamps_work_in_every_call(
    channel: grpc.aio.Channel, project_id: str
) -> None:
    await _both_extremes(channel, project_id)


async def test_the_seed_ranking_takes_them_too(
    seed_channel: grpc.aio.Channel, project_id: str
) -> None:
    await _both_extremes(seed_channel, project_id)


async def _both_extremes(channel: grpc.aio.Channel, project_id: str) -> None:
    """One scope holding a fact and an event of year 1 and a fact of year 9999, asked now and
    as of either end."""
    memory = memory_stub(channel)
    await memory.AssertFact(
        fact_request(
            project_id,
            predicate="birthplace",
            value="London",
            statement="Ada was born in London",
            valid_from=ts(FIRST),
        )
    )
    await memory.AssertFact(
        fact_request(
            project_id,
            predicate="plan",
            value="Mars",
            statement="Ada will retire on Mars",
            valid_from=ts(LAST),
            stale_after=duration_pb2.Duration(seconds=int(DAY.total_seconds())),
        )
    )
    await memory.RecordEvent(
        event_request(
            project_id,
            payload={"speaker": "Ada", "text": "I was born in London"},
            occurred_at=ts(FIRST),
        )
    )
    now = await _call(channel, project_id, "Where was Ada born?")
    assert [f.statement for f in now.facts][:1] == ["Ada was born in London"]
    assert any("London" in e.excerpt for e in now.episodes)

    # As of year 1 nothing had been recorded yet (as_of reads memory as it was then); as of the
    # last instant, both facts are valid and recorded.
    early = await _call(channel, project_id, "Where was Ada born?", as_of=ts(FIRST + DAY))
    assert not early.facts and not early.episodes
    late = await _call(channel, project_id, "Ada?", as_of=ts(LAST), max_distance=0.0)
    assert "Ada was born in London" in [f.statement for f in late.facts]
    # Its volatility horizon lies past the last instant: still served then (the floor is off).
    assert "Ada will retire on Mars" in [f.statement for f in late.facts]
