"""A context budget bounds the block the agent puts in its prompt (SATCHEL_BUDGET_COUNTS=block,
the default), counted with a real tokenizer when SATCHEL_TOKENIZER names one; the packet names
its counter. Real server, embedded PostgreSQL, the bundled model."""

from __future__ import annotations

import random
import re
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
import pytest
from google.protobuf import timestamp_pb2
from helpers.memory import event_request
from helpers.memory import stub as memory_stub
from helpers.paths import ROOT
from helpers.servers import channel_to, running
from test_context import CAROLINE, assemble, assert_facts
from tokenizers import Tokenizer

from satchel.server.platform.config import ConfigError, Settings
from satchel.v1 import memory_pb2

TOKENIZER = ROOT / "server" / "embedding" / "assets" / "all-MiniLM-L6-v2" / "tokenizer.json"
WORDS = [
    "Lisbon",
    "garden",
    "violin",
    "nurse",
    "Biscuit",
    "beach",
    "marathon",
    "Porto",
    "sourdough",
    "hospital",
]


async def load_scope(channel: grpc.aio.Channel, project_id: str) -> None:
    await assert_facts(channel, project_id, CAROLINE)
    rng = random.Random(37)
    events = [
        event_request(
            project_id,
            payload={
                "speaker": "Caroline",
                "text": " ".join(rng.choices(WORDS, k=rng.randint(3, 40))),
            },
        )
        for _ in range(25)
    ]
    await memory_stub(channel).BatchRecordEvents(
        memory_pb2.BatchRecordEventsRequest(requests=events)
    )


async def test_a_tokenizer_counts_the_block_and_the_block_fits_the_budget(
    settings: Settings, project_id: str
) -> None:
    tokenizer = Tokenizer.from_file(str(TOKENIZER))
    tokenizer.no_padding()
    tokenizer.no_truncation()

    def tokens(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False).ids)

    async with running(settings, tokenizer=TOKENIZER) as server, channel_to(server) as channel:
        await load_scope(channel, project_id)
        served = 0
        for budget in (1, 12, 25, 40, 64, 100, 180, 300, 900):
            for query in ("Tell me about Caroline", "Where does the dog walk?"):
                reply = await assemble(channel, project_id, query, budget_tokens=budget)
                packet = reply.packet
                assert packet.token_counter == "block:tokenizer:tokenizer.json"
                assert packet.tokens_used == tokens(packet.block) <= budget, (budget, query)
                served += len(packet.facts) + len(packet.episodes)
        assert served > 0 and "<satchel_memory>" in packet.block


async def test_the_items_budget_of_the_seed_stays_reachable(
    settings: Settings, project_id: str
) -> None:
    items = replace(settings.context, budget_counts="items")
    async with running(settings, context=items) as server, channel_to(server) as channel:
        await load_scope(channel, project_id)
        reply = await assemble(channel, project_id, "Tell me about Caroline", budget_tokens=60)
    packet = reply.packet
    assert packet.token_counter == "items:chars/4"
    texts = sum(max(1, len(f.statement) // 4) for f in packet.facts) + sum(
        max(1, len(e.excerpt) // 4) for e in packet.episodes
    )
    assert packet.tokens_used == texts <= 60
    assert len(packet.block) // 4 > 60, "the items rule does not count the block around them"


async def test_a_tokenizer_that_is_not_one_stops_the_server(
    settings: Settings, tmp_path: Path
) -> None:
    missing = tmp_path / "nowhere.json"
    with pytest.raises(ConfigError, match="SATCHEL_TOKENIZER"):
        replace(settings, tokenizer=missing).validate()
    broken = tmp_path / "tokenizer.json"
    broken.write_text('{"not": "a tokenizer"}')
    with pytest.raises(ConfigError, match=r"is not a tokenizer\.json"):
        async with running(settings, tokenizer=broken):
            pass


def _stamp(instant: datetime) -> timestamp_pb2.Timestamp:
    stamp = timestamp_pb2.Timestamp()
    stamp.FromDatetime(instant)
    return stamp


async def test_the_dated_layout_says_each_day_once_and_serves_more_than_lines(
    settings: Settings, project_id: str
) -> None:
    """The default block groups episodes under their day and kind (one header a group, charged
    with its first line); the one-line layout (SATCHEL_BLOCK_LAYOUT=lines) stays reachable and,
    repeating the date and kind on every line, serves fewer items in the same budget."""
    start = datetime(2024, 5, 2, 8, 0, tzinfo=UTC)
    rng = random.Random(41)
    events = [
        event_request(
            project_id,
            payload={"speaker": "Caroline", "text": " ".join(rng.choices(WORDS, k=6))},
            occurred_at=_stamp(start + timedelta(days=i % 3, minutes=i)),
        )
        for i in range(30)
    ]
    served = {}
    for layout in ("dated", "lines"):
        context = replace(settings.context, block_layout=layout)
        async with running(settings, context=context) as server, channel_to(server) as channel:
            if layout == "dated":
                await memory_stub(channel).BatchRecordEvents(
                    memory_pb2.BatchRecordEventsRequest(requests=events)
                )
            reply = await assemble(channel, project_id, "garden violin Lisbon", budget_tokens=250)
        packet = reply.packet
        assert packet.tokens_used == max(1, len(packet.block) // 4) <= 250
        lines = packet.block.splitlines()
        items = [line for line in lines if line.startswith("- ")]
        assert len(items) == len(packet.episodes) > 0
        if layout == "dated":
            headers = [line for line in lines if line.endswith(", conversation.message:")]
            days = [header.split(",")[0] for header in headers]
            assert days == sorted(set(days)) and len(days) > 1, lines
            assert all(re.match(r"- \d\d:\d\d Caroline: ", line) for line in items), items
        else:
            assert all(line.startswith("- [2024-05-0") for line in items), items
        served[layout] = len(packet.episodes)
    assert served["dated"] > served["lines"], served
