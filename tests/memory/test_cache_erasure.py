"""What a write takes away is never served again from a server's in-memory copy of the scope
(server/context/scope_cache.py), and a scope whose copy is empty is served like any other: real
servers (two with the cache, one without) on one database and the real model."""

from __future__ import annotations

import asyncio

import grpc
from helpers.memory import event_request, fact_request
from helpers.memory import stub as memory_stub
from helpers.servers import channel_to, poll, running
from test_context import SUBJECT, assemble, stream
from test_watch import STALLED_OPTIONS, receive, watch

from satchel.server.context.scope_cache import EVENTS, FACTS, ScopeCache
from satchel.server.platform.config import Settings
from satchel.v1 import memory_pb2

QUERY = "Where does Maya keep her bicycle?"
SECRET = "Maya keeps her bicycle in the locked shed behind the bakery"
TOLD = "Long day. Anyway, I sorted out where the bike sleeps now, finally."


async def warm(channel: grpc.aio.Channel, cache: ScopeCache, project_id: str) -> None:
    """Read the scope until this server ranks its facts and events from memory."""
    for _ in range(2):
        await assemble(channel, project_id, QUERY)
    await cache.wait_loaded()
    hits = cache.stats[FACTS].hits
    await assemble(channel, project_id, QUERY)
    assert cache.stats[FACTS].hits == hits + 1, "served from memory"


async def test_a_deleted_event_takes_its_facts_out_of_every_cached_copy(
    channel: grpc.aio.Channel, project_id: str, server
) -> None:
    memory = memory_stub(channel)
    told = await memory.RecordEvent(
        event_request(project_id, payload={"speaker": "Maya", "text": TOLD})
    )
    other = await memory.RecordEvent(
        event_request(project_id, payload={"speaker": "Maya", "text": "I ride to work daily."})
    )
    drawn = await memory.AssertFact(
        fact_request(
            project_id,
            predicate="bicycle_place",
            value="shed behind the bakery",
            statement=SECRET,
            source_event_ids=[told.event.id],
        )
    )
    cache: ScopeCache = server.runtime.value.scope_cache
    await warm(channel, cache, project_id)
    served = await assemble(channel, project_id, QUERY)
    assert drawn.fact.id in [f.id for f in served.packet.facts]

    await memory.DeleteEvent(
        memory_pb2.DeleteEventRequest(project_id=project_id, event_id=told.event.id)
    )
    for _ in range(3):  # the statements, then a reload at the new versions, then memory
        after = await assemble(channel, project_id, QUERY)
        await cache.wait_loaded()
        assert drawn.fact.id not in [f.id for f in after.packet.facts]
        assert SECRET not in str(after.packet)
    assert other.event.id


async def test_a_scope_whose_facts_are_all_inactive_is_served(
    channel: grpc.aio.Channel, project_id: str, server
) -> None:
    memory = memory_stub(channel)
    told = await memory.RecordEvent(
        event_request(project_id, payload={"speaker": "Maya", "text": SECRET})
    )
    fact = await memory.AssertFact(
        fact_request(project_id, predicate="bicycle_place", value="shed", statement=SECRET)
    )
    await memory.RetireFact(
        memory_pb2.RetireFactRequest(project_id=project_id, fact_id=fact.fact.id, reason="sold")
    )
    cache: ScopeCache = server.runtime.value.scope_cache
    for _ in range(2):
        await assemble(channel, project_id, QUERY)
    await cache.wait_loaded()
    hits = cache.stats[FACTS].hits
    for _ in range(2):
        served = await assemble(channel, project_id, QUERY)
        assert not served.packet.facts
        assert [e.event_id for e in served.packet.episodes] == [told.event.id]
        messages = await stream(channel, project_id, QUERY)
        assert messages[-1].packet.episodes[0].event_id == told.event.id
    assert cache.stats[FACTS].hits == hits + 4, "the empty copy served"

    # The same when the only event is deleted with its fact: no fact, no event.
    await memory.DeleteEvent(
        memory_pb2.DeleteEventRequest(project_id=project_id, event_id=told.event.id)
    )
    for _ in range(4):
        served = await assemble(channel, project_id, QUERY)
        await cache.wait_loaded()
        assert not served.packet.facts and not served.packet.episodes
    assert cache.stats[EVENTS].hits > 0


async def test_an_erasure_drops_the_scopes_copies_on_every_server_at_once(
    channel: grpc.aio.Channel, project_id: str, server, settings: Settings
) -> None:
    """DeleteSubject on one server: its copies and another server's are dropped (the other one
    hears of it from the database), not left in memory until evicted."""
    memory = memory_stub(channel)
    await memory.RecordEvent(event_request(project_id, payload={"speaker": "Maya", "text": TOLD}))
    await memory.AssertFact(
        fact_request(project_id, predicate="bicycle_place", value="shed", statement=SECRET)
    )
    local: ScopeCache = server.runtime.value.scope_cache
    async with running(settings) as other, channel_to(other) as other_channel:
        remote: ScopeCache = other.runtime.value.scope_cache
        await warm(channel, local, project_id)
        await warm(other_channel, remote, project_id)
        assert (
            local.held(project_id, SUBJECT) == remote.held(project_id, SUBJECT) == [EVENTS, FACTS]
        )
        await memory.DeleteSubject(
            memory_pb2.DeleteSubjectRequest(project_id=project_id, subject_id=SUBJECT)
        )
        assert local.held(project_id, SUBJECT) == [], "dropped before the reply"
        assert await poll(lambda: nothing_held(remote, project_id))


async def nothing_held(cache: ScopeCache, project_id: str) -> bool:
    return cache.held(project_id, SUBJECT) == []


async def test_a_watcher_behind_an_erasure_is_sent_the_call_without_what_was_deleted(
    channel: grpc.aio.Channel, address: str, project_id: str, server
) -> None:
    """A call read for one watcher is not handed, as read then, to a watcher still behind it
    once the event it quotes is deleted: it is read again."""
    memory = memory_stub(channel)
    for i in range(6):
        await memory.AssertFact(
            fact_request(project_id, predicate=f"note_{i}", value=i, statement=f"{TOLD} {i}")
        )
    told = await memory.RecordEvent(
        event_request(project_id, payload={"speaker": "Maya", "text": SECRET})
    )
    hub = server.runtime.value.traces
    async with grpc.aio.insecure_channel(address, options=STALLED_OPTIONS) as slow_channel:
        reader, behind = watch(channel, project_id), watch(slow_channel, project_id)
        await asyncio.gather(reader.initial_metadata(), behind.initial_metadata())
        calls = 30  # the slow watcher's window fills long before the last one
        for _ in range(calls):
            await assemble(channel, project_id, QUERY)
        await receive(reader, calls, timeout=30)  # every call read, and kept for watchers
        (waiting,) = [w for w in hub.watchers_of(project_id) if w.pending]
        later = {ref.trace_id for ref in waiting.pending}  # read for it after the erasure
        await memory.DeleteEvent(
            memory_pb2.DeleteEventRequest(project_id=project_id, event_id=told.event.id)
        )
        seen = await receive(behind, calls, timeout=60)
        assert later <= {call.trace_id for call in seen}
        for call in seen:
            if call.trace_id in later:
                quoted = [d.preview for d in call.decisions] + [str(call.packet)]
                assert not any("locked shed" in text for text in quoted)
        reader.cancel()
        behind.cancel()
